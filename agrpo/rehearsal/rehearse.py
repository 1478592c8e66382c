"""`--rehearse`: a launcher=hf_jobs plan runs against the stand-in, started and stopped here (I/O).

The stand-in is handed to the Jobs executor as what it talks to (`Rehearsal.api()`, `.token`, `.reach`, through the
Hub backend of backend.py): nothing
in this process's environment changes, and a real token never reaches a rehearsal Job (each rehearsal makes a fresh
`hf_rehearsal_...` token). Bucket files travel over plain HTTP (plain_transfer.py): Xet, the Hub's transfer
protocol, is the one part of the path that is not rehearsed. The `<rehearsal-gateway-port>` placeholder in the plan
(in the replica URL pattern and the trainer's config) becomes the gateway's port.

The one process-wide switch touched is huggingface_hub's offline flag (its shared HTTP session refuses every request
while HF_HUB_OFFLINE=1, and a rehearsal runs offline): it is lifted while the stand-in runs and restored after.

`replay(root)` serves a finished rehearsal's bucket folders and Jobs (jobs.json) through the same API, without
running anything, so `agrpo pull --rehearsal-dir` and `agrpo jobs status --rehearsal-dir` work after the run.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import tempfile
from pathlib import Path
from typing import Any, Iterator

from agrpo.errors import LaunchError
from agrpo.rehearsal import jobs as J
from agrpo.rehearsal.runner import namespaces_available
from agrpo.rehearsal.plain_transfer import plain_transfer_api
from agrpo.rehearsal.server import Listeners
from agrpo.rehearsal.standin import StandIn

log = logging.getLogger(__name__)
GATEWAY_PLACEHOLDER = "<rehearsal-gateway-port>"
REHEARSAL_NAMESPACE = "rehearsal"


def rehearsal_api_class() -> Any:
    """HfApi on the stand-in; bucket files travel as plain HTTP (the stand-in does not speak Xet)."""
    from huggingface_hub import HfApi

    return plain_transfer_api(HfApi)


class Rehearsal:
    """The running stand-in: its API, its token, its gateway, its Jobs' folders under `root`."""

    def __init__(self, stand_in: StandIn, listeners: Listeners):
        self.stand_in, self.listeners = stand_in, listeners

    @property
    def gateway_port(self) -> str:
        return self.stand_in.gateway.rsplit(":", 1)[1]

    @property
    def token(self) -> str:
        return self.stand_in.token

    @property
    def namespace(self) -> str:
        return self.stand_in.namespace

    def api(self) -> Any:
        return rehearsal_api_class()(endpoint=self.stand_in.api_url, token=self.stand_in.token)

    def reach(self, url: str) -> str:
        """The launching process cannot resolve `<job_id>--<port>.hf.jobs`: it asks the gateway by path."""
        return J.path_form(url, self.stand_in.gateway)


@contextlib.contextmanager
def hub_online() -> Iterator[None]:
    """huggingface_hub's offline switch lifted (the stand-in is on this machine), restored on the way out."""
    import huggingface_hub.constants as hub_constants

    offline, hub_constants.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE, False
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = offline


def fresh_token() -> str:
    return "hf_rehearsal_" + secrets.token_hex(16)


@contextlib.contextmanager
def rehearsal(
    namespace: str,
    lag_s: float,
    negative_cache_s: float,
    root: str | None = None,
    preempt_trainer_after_s: float | None = None,
    prices: dict[str, float] | None = None,
) -> Iterator[Rehearsal]:
    """The stand-in, running until the block ends (then every Job is ended). `preempt_trainer_after_s` (tests only)
    kills the trainer Job's first attempt after that long; `prices` ($/hour per flavor) is its hardware list."""
    why = namespaces_available()
    if why:
        raise LaunchError(
            f"--rehearse cannot run here: {why}. Run the rehearsal as root (e.g. "
            "in a container) or check the plan with launcher.dry_run=true"
        )
    folder = Path(root) if root else Path(tempfile.mkdtemp(prefix="agrpo-rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    stand_in = StandIn(
        folder,
        namespace,
        fresh_token(),
        lag_s=lag_s,
        negative_cache_s=negative_cache_s,
        preempt_trainer_after_s=preempt_trainer_after_s,
        prices=prices,
    )
    listeners = Listeners(stand_in)
    listeners.start()
    stand_in.watcher.start()
    log.info(
        "rehearsal: stand-in Hub at %s, gateway %s, Jobs and bucket under %s",
        stand_in.api_url,
        stand_in.gateway,
        folder,
    )
    try:
        with hub_online():
            yield Rehearsal(stand_in, listeners)
    finally:
        left = stand_in.close()
        listeners.stop()
        if left:
            log.warning("rehearsal: killed %d process(es) left by Jobs after they ended: %s", len(left), left)
        log.info("rehearsal: every Job ended; their logs and the bucket folder stay in %s", folder)


@contextlib.contextmanager
def replay(root: str | Path, prices: dict[str, float] | None = None) -> Iterator[Rehearsal]:
    """A finished rehearsal's Hub: its bucket folders and its Jobs as they ended (no Job runs, no root needed)."""
    folder = Path(root)
    if not (folder / "buckets").is_dir():
        raise LaunchError(f"{folder} holds no rehearsal (no buckets/ folder): pass the folder its end named")
    stand_in = StandIn.revive(folder, fresh_token(), prices=prices)
    listeners = Listeners(stand_in)
    listeners.start()
    try:
        with hub_online():
            yield Rehearsal(stand_in, listeners)
    finally:
        listeners.stop()
