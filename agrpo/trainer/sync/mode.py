"""How `sync.mode=background` plugs into TRL's AsyncGRPOTrainer (the thread and its rules: sync/background.py).

TRL's `_sync_weight` times whatever `_sync_weight_lora(t0)` does and logs it as `perf/weight_sync_s` (plus the
pause, barrier and transfer phases it returns). `AgrpoAsyncGRPOTrainer._sync_weight_lora`
(agrpo/trainer/seam/trainer.py, with the logic it needs) publishes without a pause once `BackgroundSyncRun` started
the thread: a snapshot of the adapter's tensors (agrpo/trainer/sync/snapshot.py; the thread writes the files, with
TRL's atomic rename), the load handed to the thread (through `AgrpoVLLMClient`'s load: the store's visibility, the
proxy's serve-first answer, the retention policy), and a wait only when the trainer would otherwise train on nothing
usable.
So TRL's metric keeps its meaning, the time a sync blocked the trainer, and
`sync/publish_to_loaded_s` is hand-over -> served, measured by the thread.
"""

from __future__ import annotations

import logging
import time
import urllib.request
from typing import Any

from transformers import TrainerCallback

from agrpo.interprocess import PROXY_STATS, answer_record
from agrpo.trainer.sync.background import BackgroundSync

log = logging.getLogger(__name__)


class SyncMetricsCallback(TrainerCallback):
    """Moves the thread's figures into TRL's metrics on the trainer's own thread (its dict is not thread-safe)."""

    def __init__(self, trainer: Any, sync: BackgroundSync):
        self.trainer = trainer
        self.sync = sync

    def on_step_end(self, args, state, control, **kwargs):
        while not self.sync.metrics.empty():
            key, value = self.sync.metrics.get_nowait()
            self.trainer.record(key, value)


def wait_until_every_replica_serves(proxy_url: str, name: str, timeout_s: float, poll_s: float = 0.2) -> bool:
    """At the end of a run behind the proxy: let the slower replicas finish loading the final version, so every
    healthy replica serves it when the run ends. Best effort (False after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            url = f"{proxy_url.rstrip('/')}/proxy/stats"
            with urllib.request.urlopen(url, timeout=5) as response:  # parsed at the guarded boundary
                replicas = answer_record(response.read(), PROXY_STATS, url, default={}).get("replicas", [])
        except OSError as error:
            log.debug("proxy stats unavailable: %s", error)
            return False
        if all(name in r.get("adapters", []) for r in replicas if r.get("healthy")):
            return True
        time.sleep(poll_s)
    return False


class BackgroundSyncRun:
    """`sync.mode=background` on one AgrpoAsyncGRPOTrainer, entered around `trainer.train()` inside the adapter
    retention: on the way out the last published version is served (behind the proxy, on every healthy replica)
    before the thread stops, while the retention policy still decides what is deleted."""

    def __init__(self, trainer: Any, store: Any, gate: bool, timeout_s: float, via_proxy: bool):
        self.trainer, self.store, self.gate = trainer, store, gate
        self.timeout_s, self.via_proxy = timeout_s, via_proxy
        self.client = getattr(trainer, "vllm_client", None)
        self.sync: BackgroundSync | None = None
        self.callback: SyncMetricsCallback | None = None

    def __enter__(self) -> BackgroundSync | None:
        trainer = self.trainer
        if self.client is None:  # other ranks: they only take part in the collective save
            trainer.sync_in_background(None, self.timeout_s)
            return None
        from agrpo.trainer.seam.client import Visibility

        client = self.client
        lora_dir, lora_name = trainer.adapter_folders
        self.sync = BackgroundSync(
            lora_name=lora_name,  # the folders
            served_name=trainer.served_lora_name,  # loads, unloads, requests: `<tenant>/trl-policy` on a shared fleet
            lora_dir=lora_dir,
            max_staleness=trainer.args.max_staleness,
            load=lambda name, path: client.load_lora_adapter(name, path),
            unload=lambda name: client.unload_lora_adapter(name),
            delete=trainer.delete_published,
            on_served=trainer.rollout_worker.update_model_version,
        )
        record = lambda key, value: self.sync.metrics.put((key, value))  # noqa: E731  (the thread's figures)
        visibility = Visibility(self.store, self.timeout_s, record) if self.gate else None
        client.load_through(visibility, serve_first=True)  # one vLLM server ignores the query
        trainer.sync_in_background(self.sync, self.timeout_s)
        self.callback = SyncMetricsCallback(trainer, self.sync)
        trainer.add_callback(self.callback)
        return self.sync

    def summary(self) -> dict[str, Any] | None:
        """metrics.json's `sync` (None on the other ranks)."""
        return None if self.sync is None else {"mode": "background", **self.sync.state.summary()}

    def __exit__(self, kind, error, traceback) -> None:
        if self.sync is None:
            return
        finished = kind is None
        try:
            self.sync.close(drain=finished, timeout_s=self.timeout_s)
        finally:
            self.trainer.remove_callback(self.callback)
        served = self.sync.state.served
        if finished and self.via_proxy and served:
            if not wait_until_every_replica_serves(self.client.server_url, self.sync.name(served), self.timeout_s):
                log.warning("not every replica loaded %s before the end of the run", self.sync.name(served))
