"""A few counters shared by the trainer and the rollout child: the budget of samples ahead and how many were taken.

The two processes share a small memory-mapped file whose path is a plain string, so it travels in the loop's settings
(worker.py's `pace`). It was chosen when TRL spawned the child and pickled its keyword arguments up front, which a
synchronized `multiprocessing.Value` refuses outside of spawning. Each slot is an aligned 64-bit integer written by one
side only, read by the other.

Written by the trainer: `budget` (samples the generator may have ahead of the trainer; 0 = no limit), `consumed`
(samples the trainer took off the queue, trained or dropped) and `published` (the newest adapter version saved, which
may still be loading; background sync only). Written by the child: `admitted` (rollouts started),
`finished` (rollouts done), `scored` (rollouts whose group was scored) and `produced` (samples put on the queue).
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from typing import Any

SLOTS = ("budget", "consumed", "published", "admitted", "finished", "scored", "produced")
_SIZE = 8 * len(SLOTS)
_INT = struct.Struct("<q")


class ControlBlock:
    """The shared counters; `create()` in the trainer, `attach(path)` in the child."""

    def __init__(self, path: str, owner: bool):
        self.path = path
        self.owner = owner
        self._file = open(path, "r+b")  # mapped for the block's lifetime, closed in close()
        self._map = mmap.mmap(self._file.fileno(), _SIZE)

    @classmethod
    def create(cls, directory: str | None = None) -> ControlBlock:
        fd, path = tempfile.mkstemp(prefix="agrpo-rollout-", suffix=".ctl", dir=directory or _shm_dir())
        with os.fdopen(fd, "wb") as handle:
            handle.write(bytes(_SIZE))
        return cls(path, owner=True)

    @classmethod
    def attach(cls, path: str) -> ControlBlock:
        return cls(path, owner=False)

    def get(self, name: str) -> int:
        return _INT.unpack_from(self._map, 8 * SLOTS.index(name))[0]

    def set(self, name: str, value: int) -> None:
        _INT.pack_into(self._map, 8 * SLOTS.index(name), int(value))

    def snapshot(self) -> dict[str, int]:
        return {name: self.get(name) for name in SLOTS}

    def close(self) -> None:
        try:
            self._map.close()
            self._file.close()
        finally:
            if self.owner:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass


def samples_ahead(counters: dict[str, int]) -> int:
    """Rollouts started and not yet scored, plus samples scored and not yet taken by the trainer."""
    return (counters["admitted"] - counters["scored"]) + (counters["produced"] - counters["consumed"])


def _shm_dir() -> str | None:
    """RAM-backed when the machine has one (never the run dir: on a bucket mount every write would be uploaded)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class CountingQueue:
    """The trainer's side of the rollout queue: every sample taken off it counts as consumed."""

    def __init__(self, queue: Any, block: ControlBlock):
        self._queue = queue
        self._block = block
        self.consumed = 0

    def get(self, *args: Any, **kwargs: Any) -> Any:
        item = self._queue.get(*args, **kwargs)
        self.consumed += 1
        self._block.set("consumed", self.consumed)
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)
