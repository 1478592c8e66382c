"""How `sync.mode=background` plugs into TRL's AsyncGRPOTrainer (the thread and its rules: background_sync.py).

TRL's `_sync_weight` times whatever `_sync_weight_lora(t0)` does and logs it as `perf/weight_sync_s` (plus the
pause, barrier and transfer phases it returns). `BackgroundSyncRun` replaces `_sync_weight_lora` on one trainer with
`sync_without_pause`: no pause, a snapshot of the adapter's tensors (agrpo/trainer/adapter_snapshot.py; the thread
writes the files, with TRL's atomic rename), the load handed to the thread, and a wait only when the trainer would
otherwise train on nothing usable. So TRL's metric keeps its meaning, the time a sync blocked the trainer, and
`sync/publish_to_loaded_s` is hand-over -> served, measured by the thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from typing import Any

from transformers import TrainerCallback

from agrpo.trainer.adapter_snapshot import snapshot_adapter
from agrpo.trainer.background_sync import BackgroundSync, version_needed
from agrpo.trainer.rollout_pacing import note_published

log = logging.getLogger(__name__)

SERVE_FIRST_QUERY = "serve=first"  # agrpo/proxy/availability.py; a single vLLM server ignores it


def serve_first_loader(client: Any) -> Any:
    """TRL's `VLLMClient.load_lora_adapter`, asking the proxy to answer once one replica serves the adapter."""
    from trl.experimental.async_grpo import vllm_client

    def load(lora_name: str, lora_path: str, timeout: int = 1800) -> None:
        response = vllm_client.requests.post(  # the module's `requests`: it carries the admin token when set
            f"{client.server_url}/v1/load_lora_adapter?{SERVE_FIRST_QUERY}",
            json={"lora_name": lora_name, "lora_path": lora_path, "load_inplace": False},
            timeout=timeout,
        )
        if response.status_code != 200:
            raise RuntimeError(f"loading {lora_name} failed: HTTP {response.status_code}, {response.text[:500]}")

    return load


def sync_without_pause(
    trainer: Any, sync: BackgroundSync | None, timeout_s: float, t0: float
) -> tuple[float, float, float]:
    """Stands in for TRL's `_sync_weight_lora(t0)`; returns its (pause, barrier, transfer) marks. The trainer only
    snapshots the adapter (a collective under FSDP: every rank calls this; `sync` is None on the other ranks); the
    thread writes, loads and serves it."""
    version = trainer.model_version + 1
    adapter_dir = os.path.join(trainer._lora_dir, f"{trainer._lora_name}-v{version}")
    model = trainer.accelerator.unwrap_model(trainer.model)
    t_pause = time.time()  # nothing is paused
    trainer.accelerator.wait_for_everyone()
    t_barrier = time.time()
    snapshot = snapshot_adapter(model, trainer.accelerator, trainer._adapter_name)
    if sync is not None:
        needed = version_needed(version, sync.state.served, trainer.args.max_staleness)
        note_published(trainer, version)
        sync.publish(version, adapter_dir, snapshot.write)
        waited = sync.wait_until_served(needed, timeout_s)
        trainer._metrics["train"]["sync/wait_for_served_s"].append(waited)
        trainer.model_version = version  # the policy the trainer holds: staleness is measured against it
    return t_pause, t_barrier, time.time()


class SyncMetricsCallback(TrainerCallback):
    """Moves the thread's figures into TRL's metrics on the trainer's own thread (its dict is not thread-safe)."""

    def __init__(self, trainer: Any, sync: BackgroundSync):
        self.trainer = trainer
        self.sync = sync

    def on_step_end(self, args, state, control, **kwargs):
        metrics = self.trainer._metrics["train"]
        while not self.sync.metrics.empty():
            key, value = self.sync.metrics.get_nowait()
            metrics[key].append(value)


def wait_until_every_replica_serves(proxy_url: str, name: str, timeout_s: float, poll_s: float = 0.2) -> bool:
    """At the end of a run behind the proxy: let the slower replicas finish loading the final version, so every
    healthy replica serves it when the run ends. Best effort (False after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{proxy_url.rstrip('/')}/proxy/stats", timeout=5) as response:
                replicas = json.loads(response.read())["replicas"]
        except (OSError, ValueError, KeyError) as error:
            log.debug("proxy stats unavailable: %s", error)
            return False
        if all(name in r.get("adapters", []) for r in replicas if r.get("healthy")):
            return True
        time.sleep(poll_s)
    return False


class BackgroundSyncRun:
    """`sync.mode=background` on one trainer. Built before the adapter-retention wrappers are installed (the load it
    installs must be the innermost), entered around `trainer.train()` inside them: on the way out the last published
    version is served (behind the proxy, on every healthy replica) before the thread stops, while the retention
    policy still decides what is deleted."""

    def __init__(self, trainer: Any, store: Any, gate: bool, timeout_s: float, via_proxy: bool):
        self.trainer, self.store, self.gate = trainer, store, gate
        self.timeout_s, self.via_proxy = timeout_s, via_proxy
        self.client = getattr(trainer, "vllm_client", None)
        self.sync: BackgroundSync | None = None
        self.callback: SyncMetricsCallback | None = None
        if self.client is not None:
            self.client.load_lora_adapter = serve_first_loader(self.client)

    def _load(self, name: str, path: str) -> None:
        start = time.monotonic()
        if self.gate:
            self.store.wait_until_visible(path, self.timeout_s)
            self.sync.metrics.put(("sync/visible_s", time.monotonic() - start))
        self.client.load_lora_adapter(name, path)  # looked up now: the wrappers installed around it count

    def __enter__(self) -> BackgroundSync | None:
        trainer = self.trainer
        if self.client is None:  # other ranks: they only take part in the collective save
            trainer._sync_weight_lora = lambda t0: sync_without_pause(trainer, None, self.timeout_s, t0)
            return None
        from trl.experimental.async_grpo import async_grpo_trainer as module

        client = self.client
        self.sync = BackgroundSync(
            lora_name=trainer._lora_name,
            lora_dir=trainer._lora_dir,
            max_staleness=trainer.args.max_staleness,
            load=self._load,
            unload=lambda name: client.unload_lora_adapter(name),
            delete=lambda path: module.shutil.rmtree(path, ignore_errors=True),
            on_served=trainer.rollout_worker.update_model_version,
        )
        trainer._sync_weight_lora = lambda t0: sync_without_pause(trainer, self.sync, self.timeout_s, t0)
        self.callback = SyncMetricsCallback(trainer, self.sync)
        trainer.add_callback(self.callback)
        return self.sync

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
