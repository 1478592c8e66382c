"""`launcher.hf_jobs.rehearse=true`: the plan runs against the stand-in, started and stopped here (I/O).

For the launch, HF_ENDPOINT points at the stand-in and HF_TOKEN is a fresh rehearsal token (a real token never
reaches a rehearsal Job); the launcher's own upload goes over plain HTTP (`RehearsalApi.batch_bucket_files`):
Xet, the Hub's upload protocol, is the one part of the path that is not rehearsed. The `<rehearsal-gateway-port>`
placeholder in the plan (in the replica URL pattern and the trainer's config) becomes the gateway's port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Iterator

from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.rehearsal import jobs as J
from agrpo.launchers.hf_jobs.rehearsal.runner import namespaces_available
from agrpo.launchers.hf_jobs.rehearsal.plain_transfer import plain_transfer_api
from agrpo.launchers.hf_jobs.rehearsal.server import Listeners
from agrpo.launchers.hf_jobs.rehearsal.standin import StandIn

log = logging.getLogger(__name__)
GATEWAY_PLACEHOLDER = "<rehearsal-gateway-port>"
REHEARSAL_NAMESPACE = "rehearsal"


def rehearsal_api_class() -> Any:
    """HfApi on the stand-in; bucket files travel as plain HTTP (the stand-in does not speak Xet)."""
    from huggingface_hub import HfApi

    return plain_transfer_api(HfApi)


class Rehearsal:
    """The running stand-in: its API, its gateway, its Jobs' folders under `root`."""

    def __init__(self, stand_in: StandIn, listeners: Listeners):
        self.stand_in, self.listeners = stand_in, listeners

    @property
    def gateway_port(self) -> str:
        return self.stand_in.gateway.rsplit(":", 1)[1]

    def api(self) -> Any:
        return rehearsal_api_class()(endpoint=self.stand_in.api_url, token=self.stand_in.token)

    def reach(self, url: str) -> str:
        """The launching process cannot resolve `<job_id>--<port>.hf.jobs`: it asks the gateway by path."""
        return J.path_form(url, self.stand_in.gateway)


@contextlib.contextmanager
def rehearsal(
    namespace: str,
    lag_s: float,
    negative_cache_s: float,
    root: str | None = None,
    preempt_trainer_after_s: float | None = None,
) -> Iterator[Rehearsal]:
    why = namespaces_available()
    if why:
        raise LaunchError(
            f"launcher.hf_jobs.rehearse=true cannot run here: {why}. Run the rehearsal as root (e.g. "
            "in a container) or check the plan with launcher.dry_run=true"
        )
    folder = Path(root) if root else Path(tempfile.mkdtemp(prefix="agrpo-rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    token = "hf_rehearsal_" + secrets.token_hex(16)
    stand_in = StandIn(
        folder,
        namespace,
        token,
        lag_s=lag_s,
        negative_cache_s=negative_cache_s,
        preempt_trainer_after_s=preempt_trainer_after_s,
    )
    listeners = Listeners(stand_in)
    listeners.start()
    stand_in.watcher.start()
    import huggingface_hub.constants as hub_constants

    saved = {key: os.environ.get(key) for key in ("HF_ENDPOINT", "HF_TOKEN")}
    os.environ.update(HF_ENDPOINT=stand_in.api_url, HF_TOKEN=token)
    offline, hub_constants.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE, False  # the stand-in is on this machine
    log.info(
        "rehearsal: stand-in Hub at %s, gateway %s, Jobs and bucket under %s",
        stand_in.api_url,
        stand_in.gateway,
        folder,
    )
    try:
        yield Rehearsal(stand_in, listeners)
    finally:
        left = stand_in.close()
        listeners.stop()
        hub_constants.HF_HUB_OFFLINE = offline
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if left:
            log.warning("rehearsal: killed %d process(es) left by Jobs after they ended: %s", len(left), left)
        log.info("rehearsal: every Job ended; their logs and the bucket folder stay in %s", folder)
