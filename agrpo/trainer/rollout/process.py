"""The rollout child's lifecycle, the trainer's side: the channels it shares with the child, the spawn, the wait for its
ready signal, and a stop that cannot hang (one concern of agrpo's rollout worker, agrpo/trainer/rollout/worker.py).

The child is spawned (never forked: the trainer holds CUDA and threads) and runs `ChildEntry`
(agrpo/trainer/rollout/entry.py) with the loop's settings. What the two sides share is `ChildChannels`: the samples
queue TRL's trainer drains (`rollout_buffer` of TRL's `RolloutWorkerProtocol`), the metrics queue it drains in `log()`,
the policy version the trainer bumps, the child's heartbeat, and the stop / ready / failed events with the failure's
one-item queue. The version and the heartbeat are read and written whole without their locks: a process that dies
holding one of those locks would block the other side (agrpo/trainer/rollout/guard.py says why that matters).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
READY_POLL_S = 1.0
STOP_JOIN_S = 15.0  # a living child that saw the stop event exits well within this
KILL_JOIN_S = 5.0
METRICS_QUEUE_SIZE = 4096  # the child drops metrics when full, so a trainer that stops reading never blocks it


@dataclass
class ChildChannels:
    """Everything the trainer and the rollout child share; made in the trainer, pickled into the child at spawn."""

    samples: Any  # scored RolloutSamples, child -> trainer (TRL's `rollout_buffer`)
    metrics: Any  # {key: value} dicts, child -> trainer (TRL's `metrics_queue`)
    model_version: Any  # mp.Value("i"): the version the trainer serves, trainer -> child
    heartbeat: Any  # mp.Value("d"): wall-clock seconds of the child's last beat, child -> trainer
    stop: Any  # mp.Event: the trainer asks the child to stop
    ready: Any  # mp.Event: the child built its loop
    failed: Any  # mp.Event: set after the failure is on `failure`
    failure: Any  # mp.Queue(maxsize=1): (type name, message, traceback)

    @classmethod
    def create(cls, context: Any, queue_maxsize: int) -> ChildChannels:
        return cls(
            samples=context.Queue(maxsize=queue_maxsize),
            metrics=context.Queue(maxsize=METRICS_QUEUE_SIZE),
            model_version=context.Value("i", 0),
            heartbeat=context.Value("d", 0.0),
            stop=context.Event(),
            ready=context.Event(),
            failed=context.Event(),
            failure=context.Queue(maxsize=1),
        )

    def set_version(self, version: int) -> None:
        self.model_version.get_obj().value = int(version)  # lockless: the module docstring

    def version(self) -> int:
        return int(self.model_version.get_obj().value)

    def beat_age(self) -> float:
        return time.time() - self.heartbeat.get_obj().value


@contextlib.contextmanager
def draining(*sources: Any) -> Iterator[None]:
    """Read and drop whatever arrives on `sources` meanwhile (a thread): a child whose queue's feeder thread holds
    unread samples cannot exit."""
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            for source in sources:
                try:
                    source.get(timeout=DRAIN_POLL_S)
                except (queue.Empty, OSError, ValueError):
                    pass

    drainer = threading.Thread(target=drain, daemon=True, name="agrpo-drain-rollouts")
    drainer.start()
    try:
        yield
    finally:
        done.set()
        drainer.join(timeout=1.0)


class ChildProcess:
    """The spawned rollout child: started once, waited for, stopped; `process` is None before and after."""

    def __init__(self, context: Any | None = None):
        self.context = context or mp.get_context("spawn")
        self.process: Any = None

    def spawn(
        self,
        target: Any,
        args: tuple,
        channels: ChildChannels,
        ready_timeout_s: float,
        exited: Callable[[int | None], Exception],
    ) -> None:
        """Start `target(*args)` and wait for `channels.ready`; a child that exits first raises `exited(exitcode)`
        at once (not after the whole timeout)."""
        channels.heartbeat.get_obj().value = time.time()  # the child's imports take a while: no hang meanwhile
        self.process = self.context.Process(target=target, args=args, name="agrpo-rollout-child", daemon=True)
        self.process.start()
        log.debug("rollout child pid=%s started; waiting up to %.0f s for it", self.process.pid, ready_timeout_s)
        deadline = time.monotonic() + ready_timeout_s
        while not channels.ready.wait(timeout=READY_POLL_S):
            if not self.process.is_alive():
                exitcode, self.process = self.process.exitcode, None
                raise exited(exitcode)
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the rollout child did not get ready within {ready_timeout_s:.0f} s")

    def exitcode(self) -> int | None:
        return None if self.process is None else self.process.exitcode

    def join(self, channels: ChildChannels) -> None:
        """Wait for the child (already signalled or killed) to exit, terminating and then killing it when it does
        not; the queues are drained meanwhile, so a child that queued samples nobody reads exits by itself."""
        process = self.process
        if process is None:
            return
        with draining(channels.samples, channels.metrics):
            process.join(STOP_JOIN_S)
            if process.is_alive():
                log.warning("the rollout child did not exit within %.0f s; terminating it", STOP_JOIN_S)
                process.terminate()
                process.join(KILL_JOIN_S)
                if process.is_alive():
                    process.kill()
                    process.join(KILL_JOIN_S)
        self.process = None
