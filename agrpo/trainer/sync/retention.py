"""Adapter files outlive their unload for as long as a request for them can still be inside a vLLM engine.

Why: vLLM's `/v1/unload_lora_adapter` only forgets the name in the API server. A request for that version already
queued in the engine keeps the adapter's *path*; if the engine's few LoRA slots evict it meanwhile, the engine
reloads it from disk, and a deleted folder kills the engine (`No adapter found for .../trl-policy-vN`, vLLM issues
#54839 and #42633). TRL 1.16 deletes a version's folder one sync after its unload, which is a fraction of a second
when syncs come every step, while a replica's queue can hold requests for many seconds. With two replicas this
took down a replica's engine in every run.

The fix here: TRL's deletion of a published version is deferred until `retain_s` seconds after that version was
unloaded. A request cannot stay inside an engine longer than the client's request timeout (the client disconnects
and vLLM aborts the request), so `retain_s` defaults to TRL's `request_timeout` plus a margin. The policy is pure
(clock and deleter injected) and unit-tested; `retain_adapter_files` enters it around one trainer's training.

That bound is what can still be in flight in the worst case; it kept ~44 versions (7.1 MiB of a tiny model's
adapters, GiBs for a real model) by step 55 of the smoke run. Where the rollout worker talks to its one replica
directly (no proxy), a version's requests are exactly the worker's own: the worker reports the oldest version any of
its open rollouts started on (`rollout/open_version_min`, agrpo/trainer/rollout/loop.py; a rollout only ever starts
on the newest version, so once that floor passes a version nothing can ask for it again), and a version below the
floor goes FINISHED_MARGIN_S after the floor was seen (a cancelled request's abort reaches the engine within a
scheduler step). Behind the proxy the time bound stays: a request the proxy failed over may still sit in a replica
(a frozen one, say) after the worker got its answer elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger(__name__)

# Seconds added to the client's request timeout: an abort reaches the engine a scheduler step after the disconnect.
ABORT_MARGIN_S = 30.0
# Seconds a version's files outlive the moment the rollout worker was seen with no request open on it (direct only).
FINISHED_MARGIN_S = 5.0
OPEN_VERSION_METRIC = "rollout/open_version_min"  # a "min" word: TRL logs the window's minimum


class AdapterRetention:
    """Decides when the folder of a published adapter version may really be deleted."""

    def __init__(
        self,
        lora_dir: str,
        lora_name: str,
        retain_s: float,
        clock: Callable[[], float] = time.monotonic,
        delete: Callable[[str], None] = lambda path: shutil.rmtree(path, ignore_errors=True),
        finished_margin_s: float = FINISHED_MARGIN_S,
        served_name: str | None = None,
    ):
        self.lora_dir = os.path.abspath(lora_dir)
        # the name loads and unloads use (`<tenant>/trl-policy` on a shared fleet: agrpo/trainer/sync/names.py)
        self._served = re.compile(rf"{re.escape(served_name or lora_name)}-v(\d+)")
        self.retain_s = retain_s
        self.clock = clock
        self.delete = delete
        self._pattern = re.compile(rf"{re.escape(lora_name)}-v(\d+)")
        self.latest_loaded = 0
        self.unloaded_at: dict[int, float] = {}  # version -> when the replicas were told to unload it
        self.pending: dict[int, str] = {}  # version -> folder whose deletion was asked for and deferred
        self.deleted: list[int] = []
        self.finished_margin_s = finished_margin_s
        self.floors: list[tuple[float, int]] = []  # (seen at, floor): from then on no request below floor was open
        self._lock = threading.Lock()  # the sync thread and the trainer's log step both collect

    def version_of(self, path: str) -> int | None:
        """The version a folder directly under `lora_dir` publishes, or None for anything else (tmp folders...)."""
        path = os.path.abspath(path)
        if os.path.dirname(path) != self.lora_dir:
            return None
        match = self._pattern.fullmatch(os.path.basename(path))
        return int(match.group(1)) if match else None

    def version_served(self, name: str) -> int | None:
        """The version a served name (a load's or unload's `lora_name`) stands for, or None for any other name."""
        match = self._served.fullmatch(name)
        return int(match.group(1)) if match else None

    def loaded(self, version: int) -> None:
        self.latest_loaded = max(self.latest_loaded, version)

    def unloaded(self, version: int) -> None:
        self.unloaded_at.setdefault(version, self.clock())

    def request_delete(self, path: str) -> bool:
        """Called instead of deleting `path`. Returns True when the deletion was deferred (an older published
        version); False means the caller deletes now (not a published version, or the one being written)."""
        version = self.version_of(path)
        if version is None or version >= self.latest_loaded:
            return False
        with self._lock:
            self.pending[version] = os.path.abspath(path)
        self.collect()
        return True

    def due(self, version: int, now: float) -> bool:
        """A version's files may go once it was unloaded at least `retain_s` ago. One never unloaded (a trainer
        that died between load and unload) is treated as unloaded when its deletion was asked for."""
        since = self.unloaded_at.setdefault(version, now)
        if now - since >= self.retain_s:
            return True
        free = next((seen for seen, floor in self.floors if floor > version), None)
        return free is not None and now - free >= self.finished_margin_s

    def none_open_below(self, floor: int) -> list[int]:
        """The rollout worker has no request open on a version below `floor` (it never starts one again); delete what
        is due. Returns the versions deleted."""
        with self._lock:
            if not self.floors or floor > self.floors[-1][1]:
                self.floors.append((self.clock(), floor))
        return self.collect()

    def collect(self) -> list[int]:
        """Delete every deferred folder that is due; return their versions. Called from the sync (TRL's delete
        request, on the sync thread in background mode) and from the trainer's log step at once: the choice of what
        is due and its removal from `pending` are one locked step, so no folder is taken twice."""
        with self._lock:
            now = self.clock()
            done = [version for version in sorted(self.pending) if self.due(version, now)]
            paths = [self.pending.pop(version) for version in done]
            for version in done:
                self.unloaded_at.pop(version, None)
            self.deleted.extend(done)
        for path in paths:
            self.delete(path)
        if done:
            log.debug("deleted adapter folders of versions %s (unloaded >= %.0f s ago)", done, self.retain_s)
        return done


class OpenVersionsCallback(TrainerCallback):
    """Hands the rollout worker's logged floor (`rollout/open_version_min`) to the retention policy."""

    def __init__(self, retention: AdapterRetention):
        self.retention = retention

    def on_log(self, args, state, control, logs=None, **kwargs):
        floor = (logs or {}).get(OPEN_VERSION_METRIC)
        if floor is not None:
            self.retention.none_open_below(int(floor))


def default_retain_s(request_timeout_s: float) -> float:
    return float(request_timeout_s) + ABORT_MARGIN_S


@contextlib.contextmanager
def retain_adapter_files(trainer: Any, retain_s: float, direct: bool = False) -> Iterator[AdapterRetention]:
    """The retention policy on a built AgrpoAsyncGRPOTrainer for the duration of `trainer.train()`
    (`trainer.retaining`: TRL's deletions of published versions are deferred, loads and unloads recorded).
    `direct`: the rollout worker talks to its one replica without a proxy, so its open versions bound retention."""
    lora_dir, lora_name = trainer.adapter_folders
    retention = AdapterRetention(lora_dir, lora_name, retain_s, served_name=trainer.served_lora_name)
    client = getattr(trainer, "vllm_client", None)  # non-main ranks neither load nor delete
    callback = OpenVersionsCallback(retention) if direct and client is not None else None
    if callback is not None:
        trainer.add_callback(callback)
    try:
        with trainer.retaining(retention):
            yield retention
    finally:
        if callback is not None:
            trainer.remove_callback(callback)
        retention.collect()
