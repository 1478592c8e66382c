"""Adapter sync off the trainer's critical path (`sync.mode=background`, the default).

TRL 1.16's LoRA sync stops the world at every weight sync: it pauses every replica, saves the adapter, loads it on
every replica, resumes them, and only then trains on. With versioned adapter names (`trl-policy-vN`) the pause
protects nothing: each request names its version and vLLM serves several at once. Here the trainer hands vN over
(a snapshot of its tensors) and trains on; a background thread writes it (TRL's atomic rename), waits until the
store shows it to the replicas (the bucket's visibility gate), loads it (behind the proxy: answered as soon as one replica serves it, the others catch up, and
vN is routed only where it is loaded; docs/proxy.md), and only then tells the rollout worker to ask for vN. No
replica is paused.

What stays true:
- The trainer's `model_version` is the policy it trains (the last version it published), so the staleness check
  (`model_version - sample.model_version <= max_staleness`) measures the real lag. Samples carry the adapter that
  generated them (agrpo/trainer/rollout/scorer.py).
- The trainer waits only when it would otherwise train on nothing usable: after publishing vN it needs
  v(N - max_staleness) served (with max_staleness 0, vN itself; before the first step, the first version). That wait
  is what `perf/weight_sync_s` counts, as TRL's metric always did: the time a sync blocked the trainer.
- Versions older than `served - max_staleness` are unloaded once a newer one is served (after a resume, starting
  with the one TRL would unload, left loaded by the previous run), and their folders are deleted through TRL's
  module `shutil`, i.e. through agrpo/trainer/sync/retention.py's deferral.
- When several versions wait to be loaded (a slow bucket), only the newest is loaded: the others would be stale.

The ordering rules are pure functions; `BackgroundSync` is the thread around them, with the loader injected.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agrpo.config.schema import SyncMode

log = logging.getLogger(__name__)

BACKGROUND = SyncMode.background.value  # sync.mode's names are the schema's (agrpo/config/schema/choices.py)


def version_needed(published: int, served: int | None, max_staleness: int) -> int:
    """The version that must be served before the trainer goes on after publishing `published`: samples of older
    versions would all be dropped as stale, so generating them would be in vain."""
    if served is None:
        return published  # nothing is served yet: the rollout worker needs a version to start with
    return max(published - max_staleness, 0)


def versions_to_unload(unloaded_through: int | None, served: int, max_staleness: int) -> list[int]:
    """Versions no rollout may ask for any more once `served` is served: up to `served - max_staleness - 1`, from
    the first one not unloaded yet. At the first version a run serves (`unloaded_through` None) only the one TRL
    would unload then, which after a resume is a version the previous run left loaded on a server still running."""
    last = served - max_staleness - 1
    first = last if unloaded_through is None else unloaded_through + 1
    return list(range(max(first, 1), last + 1))


@dataclass(frozen=True, order=True)
class Pending:
    """A version handed over by the trainer: written by `write` (None: already on disk), then loaded."""

    version: int
    path: str = field(compare=False)
    handed_over_at: float = field(compare=False)
    write: Callable[[str], None] | None = field(default=None, compare=False)


def newest(pending: Iterable[Pending]) -> Pending | None:
    """Of the versions waiting to be loaded, the one worth loading (the others are never written or loaded)."""
    return max(pending, default=None)


@dataclass
class SyncState:
    """What the thread has done, read by the trainer."""

    published: int = 0
    served: int | None = None
    unloaded_through: int | None = None  # every version up to this one is unloaded (or never needs to be)
    skipped: list[int] = field(default_factory=list)  # handed over, never written nor loaded: a newer one came
    error: BaseException | None = None

    def summary(self) -> dict[str, Any]:
        """metrics.json's `sync`: every version handed over was either loaded once or skipped for a newer one."""
        return {"published": self.published, "served": self.served, "skipped": list(self.skipped)}


class BackgroundSync:
    """Loads published adapter versions on a thread, newest first, and reports each once it is served.

    `load(name, path)` blocks until the version can be served (visibility gate included); `unload(name)` forgets it;
    `name(v)` is the served name (`served_name`-vN: `<tenant>/trl-policy-vN` on a shared fleet, sync/names.py),
    `path(v)` the folder (`lora_name`-vN, never namespaced); `delete(path)` removes its folder (deferred by the retention policy); `on_served(version)` switches the rollout
    worker. Metrics go to `metrics` (a queue drained by the trainer's thread: TRL's metric dict is not thread-safe).
    """

    def __init__(
        self,
        *,
        lora_name: str,
        lora_dir: str,
        max_staleness: int,
        load: Callable[[str, str], None],
        unload: Callable[[str], None],
        delete: Callable[[str], None],
        on_served: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
        served_name: str | None = None,
    ):
        self.lora_name = lora_name
        self.served_name = served_name or lora_name
        self.lora_dir = lora_dir
        self.max_staleness = max_staleness
        self._load, self._unload, self._delete, self._on_served = load, unload, delete, on_served
        self.clock = clock
        self.state = SyncState()
        self.metrics: queue.SimpleQueue[tuple[str, float]] = queue.SimpleQueue()
        self._pending: list[Pending] = []
        self._changed = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="agrpo-background-sync", daemon=True)
        self._thread.start()

    def name(self, version: int) -> str:
        return f"{self.served_name}-v{version}"

    def path(self, version: int) -> str:
        return os.path.join(self.lora_dir, f"{self.lora_name}-v{version}")

    # ---- the trainer's side
    def publish(self, version: int, path: str, write: Callable[[str], None] | None = None) -> None:
        """Hand vN over: `write(path)` (if given) puts its files in place, then it is loaded."""
        with self._changed:
            self._pending.append(Pending(version, path, self.clock(), write))
            self.state.published = max(self.state.published, version)
            self._changed.notify_all()

    def wait_until_served(self, version: int, timeout_s: float) -> float:
        """Block until `version` (or a newer one) is served; returns the seconds waited. Raises the thread's error,
        or TimeoutError."""
        start = self.clock()
        deadline = start + timeout_s
        with self._changed:
            while True:
                if self.state.error is not None:
                    raise RuntimeError(f"background adapter sync failed: {self.state.error}") from self.state.error
                if self.state.served is not None and self.state.served >= version:
                    return self.clock() - start
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name(version)} was not served within {timeout_s:g} s")
                self._changed.wait(min(remaining, 1.0))

    def close(self, drain: bool, timeout_s: float) -> None:
        """Stop the thread; with `drain`, first wait until the last published version is served."""
        try:
            if drain and self.state.published and self.state.error is None:
                self.wait_until_served(self.state.published, timeout_s)
        finally:
            with self._changed:
                self._closing = True
                self._changed.notify_all()
            self._thread.join(timeout=timeout_s if drain else 5.0)

    # ---- the thread
    def _next(self) -> Pending | None:
        with self._changed:
            while not self._pending and not self._closing:
                self._changed.wait()
            if not self._pending:
                return None
            chosen = newest(self._pending)
            self.state.skipped += sorted(p.version for p in self._pending if p.version != chosen.version)
            self._pending.clear()
            return chosen

    def _run(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self._serve(item)
            except BaseException as error:  # reported to the trainer, which raises it
                log.error("background sync of %s failed: %s", self.name(item.version), error)
                with self._changed:
                    self.state.error = error
                    self._changed.notify_all()
                return

    def _serve(self, item: Pending) -> None:
        version = item.version
        if item.write is not None:
            started = self.clock()
            item.write(item.path)
            self.metrics.put(("sync/write_s", self.clock() - started))
        self._load(self.name(version), item.path)
        self.metrics.put(("sync/publish_to_loaded_s", self.clock() - item.handed_over_at))
        self._on_served(version)
        with self._changed:
            self.state.served = version
            behind = self.state.published - version
            self._changed.notify_all()
        self.metrics.put(("sync/versions_behind", float(behind)))
        for stale in versions_to_unload(self.state.unloaded_through, version, self.max_staleness):
            if stale not in self.state.skipped:  # a skipped version was never loaded: nothing to unload (a 404)
                self._unload(self.name(stale))
            self._delete(self.path(stale))  # deferred by the retention policy; nothing if never written
        self.state.unloaded_through = max(self.state.unloaded_through or 0, version - self.max_staleness - 1)
