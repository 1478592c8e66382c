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
(clock and deleter injected) and unit-tested; `retain_adapter_files` installs it around one trainer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# Seconds added to the client's request timeout: an abort reaches the engine a scheduler step after the disconnect.
ABORT_MARGIN_S = 30.0


class AdapterRetention:
    """Decides when the folder of a published adapter version may really be deleted."""

    def __init__(
        self,
        lora_dir: str,
        lora_name: str,
        retain_s: float,
        clock: Callable[[], float] = time.monotonic,
        delete: Callable[[str], None] = lambda path: shutil.rmtree(path, ignore_errors=True),
    ):
        self.lora_dir = os.path.abspath(lora_dir)
        self.retain_s = retain_s
        self.clock = clock
        self.delete = delete
        self._pattern = re.compile(rf"{re.escape(lora_name)}-v(\d+)")
        self.latest_loaded = 0
        self.unloaded_at: dict[int, float] = {}  # version -> when the replicas were told to unload it
        self.pending: dict[int, str] = {}  # version -> folder whose deletion was asked for and deferred
        self.deleted: list[int] = []

    def version_of(self, path: str) -> int | None:
        """The version a folder directly under `lora_dir` publishes, or None for anything else (tmp folders...)."""
        path = os.path.abspath(path)
        if os.path.dirname(path) != self.lora_dir:
            return None
        match = self._pattern.fullmatch(os.path.basename(path))
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
        self.pending[version] = os.path.abspath(path)
        self.collect()
        return True

    def due(self, version: int, now: float) -> bool:
        """A version's files may go once it was unloaded at least `retain_s` ago. One never unloaded (a trainer
        that died between load and unload) is treated as unloaded when its deletion was asked for."""
        since = self.unloaded_at.setdefault(version, now)
        return now - since >= self.retain_s

    def collect(self) -> list[int]:
        """Delete every deferred folder that is due; return their versions."""
        now = self.clock()
        done = [version for version in sorted(self.pending) if self.due(version, now)]
        for version in done:
            self.delete(self.pending.pop(version))
            self.unloaded_at.pop(version, None)
            self.deleted.append(version)
        if done:
            log.debug("deleted adapter folders of versions %s (unloaded >= %.0f s ago)", done, self.retain_s)
        return done


class _RetainingShutil:
    """Stands in for the `shutil` module inside TRL's trainer module: `rmtree` of a published adapter version goes
    through the retention policy, everything else is the real shutil."""

    def __init__(self, retention: AdapterRetention):
        self._retention = retention

    def rmtree(self, path: Any, *args: Any, **kwargs: Any) -> None:
        if not self._retention.request_delete(os.fspath(path)):
            shutil.rmtree(path, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(shutil, name)


def default_retain_s(request_timeout_s: float) -> float:
    return float(request_timeout_s) + ABORT_MARGIN_S


@contextlib.contextmanager
def retain_adapter_files(trainer: Any, retain_s: float) -> Iterator[AdapterRetention]:
    """Install the retention policy on a built AsyncGRPOTrainer for the duration of `trainer.train()`: TRL's
    deletions of published versions are deferred, loads and unloads are recorded. Restores TRL's module after."""
    from trl.experimental.async_grpo import async_grpo_trainer as module

    retention = AdapterRetention(trainer._lora_dir, trainer._lora_name, retain_s)
    client = getattr(trainer, "vllm_client", None)
    originals = {}
    if client is not None:  # non-main ranks neither load nor delete
        originals = {"load_lora_adapter": client.load_lora_adapter, "unload_lora_adapter": client.unload_lora_adapter}

        def load(lora_name: str, lora_path: str, *args: Any, **kwargs: Any) -> Any:
            result = originals["load_lora_adapter"](lora_name, lora_path, *args, **kwargs)
            version = retention.version_of(lora_path)
            if version is not None:
                retention.loaded(version)
            return result

        def unload(lora_name: str, *args: Any, **kwargs: Any) -> Any:
            version = retention.version_of(os.path.join(retention.lora_dir, lora_name))
            if version is not None:
                retention.unloaded(version)
            return originals["unload_lora_adapter"](lora_name, *args, **kwargs)

        client.load_lora_adapter = load
        client.unload_lora_adapter = unload
    module.shutil = _RetainingShutil(retention)
    try:
        yield retention
    finally:
        module.shutil = shutil
        for name, original in originals.items():
            setattr(client, name, original)
        retention.collect()
