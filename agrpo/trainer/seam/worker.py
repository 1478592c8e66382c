"""`AgrpoRolloutWorker`: TRL's `AsyncRolloutWorker` (the trainer's handle on the spawned rollout child), agrpo's way.

Every change is an override or a method of this class; the logic each one calls lives in its own module:

- `_loop_cls` (TRL's class default): `AgrpoRolloutLoop`; `run_loop(cls)` sets the run's (loop_install.py).
- `start()`: the child logs to trainer.log from its first line; a child that failed during init says why
  (rollout_guard.py, child_entry.py).
- `check_health(stale_after_s)`: a failure, a death or a hang is one paragraph (rollout_guard.py).
- `stop()`: never blocks on a dead child's stop event (CPython #75158), kills a failed one at once, drains the queues
  so a living one exits by itself.
- the loop's keyword arguments: `pace(control, max_staleness)` hands the paced loop its control block
  (rollout_pacing.py).

TRL builds its own worker inside `AsyncGRPOTrainer.__init__`, from values it derives there (the model id, the LoRA
name once the server was probed, the tokenizer it loaded); `AgrpoAsyncGRPOTrainer` replaces it with this class built
from the very same arguments (`replacing`), before anything started it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

from agrpo.trainer.loop_install import loop_to_run
from agrpo.trainer.rollout_guard import RolloutGuard
from agrpo.trainer.seam.child_entry import ChildEntry
from agrpo.trainer.rollout_loop import ROLLOUT_LOG_ENV, AgrpoRolloutLoop

DRAIN_POLL_S = 0.05


class _AlreadySet:
    """The stop event as TRL's `stop()` sees it once the guard has signalled the child (or found it gone)."""

    def set(self) -> None:
        pass


class _ChildEntryContext:
    """TRL's spawn context, except that a process's target is `entry` (which then calls TRL's `_child_main`)."""

    def __init__(self, context: Any, entry: ChildEntry):
        self._context = context
        self._entry = entry

    def Process(self, *, target: Any, **kwargs: Any) -> Any:  # noqa: N802  (multiprocessing's name)
        return self._context.Process(target=self._entry, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


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


class AgrpoRolloutWorker(AsyncRolloutWorker):
    """TRL's rollout worker with agrpo's loop class, guard and stop (the module docstring has the table)."""

    _loop_cls = AgrpoRolloutLoop  # TRL's class attribute; a run chooses its own with `run_loop`

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.guard: RolloutGuard | None = None

    @classmethod
    def replacing(cls, worker: AsyncRolloutWorker, served_lora_name: str | None = None) -> "AgrpoRolloutWorker":
        """This class, built with the arguments TRL gave `worker` (its loop's keyword arguments, queue size
        included). `worker` must not have started. TRL's loop asks for `f"{lora_name}-v{N}"` with its `_lora_name`;
        `served_lora_name` replaces it (a shared fleet's `<tenant>/trl-policy`) where TRL syncs adapters (a
        `lora_name` of None: TRL syncs full weights and requests name the base model)."""
        if worker._process is not None:
            raise RuntimeError("the rollout worker to replace has already started its child")
        kwargs = dict(worker._loop_kwargs)
        if served_lora_name is not None and kwargs.get("lora_name") is not None:
            kwargs["lora_name"] = served_lora_name
        return cls(**kwargs)

    def run_loop(self, loop_cls: type) -> type:
        """Spawn `loop_cls` (TRL passes the class to the child by reference). A loop that `loop_cls` extends is
        replaced, one that extends it kept, any other refused (loop_install.py)."""
        self._loop_cls = loop_to_run(self._loop_cls, loop_cls)
        return self._loop_cls

    def pace(self, control_path: str, max_staleness: int) -> None:
        """Hand the paced loop (rollout_child.py) the control block it reads, through the keyword arguments TRL
        forwards to the loop when the child spawns."""
        from agrpo.trainer.rollout_child import PacingMixin

        if not issubclass(self._loop_cls, PacingMixin):  # its keyword arguments would fail any other loop
            raise RuntimeError(
                f"the rollout worker runs {self._loop_cls.__qualname__}, which cannot be paced: install the paced "
                "loop first (agrpo/trainer/loop_install.py)"
            )
        self._loop_kwargs.update(agrpo_control=control_path, agrpo_max_staleness=max_staleness)

    def watch(self, guard: RolloutGuard) -> None:
        """Guard this worker (rollout_guard.py): from now on the child starts through `ChildEntry` (child_entry.py: its
        logging is set up before TRL is imported in it) and failures, deaths and hangs end the run."""
        self.guard = guard
        self._mp_ctx = _ChildEntryContext(self._mp_ctx, ChildEntry(guard.run_dir, guard.level))

    def start(self) -> None:
        """TRL spawns the child and waits for its ready signal; a child that exits during init is a bare
        `RuntimeError` ("Check the child's stderr"). agrpo: the child logs where the trainer does (trainer.log), and
        a guarded child that reported why it failed (a chat template TRL does not recognise, say) is that paragraph."""
        from agrpo.trainer.logs import current_log_file

        log_file = current_log_file()
        if log_file:  # the spawned child reads its environment
            os.environ[ROLLOUT_LOG_ENV] = log_file
        if self.guard is None:
            super().start()
        else:
            self.guard.start(super().start)

    def check_health(self, stale_after_s: float) -> None:
        """TRL raises a `RuntimeError` chaining the child's traceback when it failed, or when its heartbeat is older
        than `stale_after_s`. agrpo: `RolloutFailed`, one paragraph with the step; a child that died without a word
        is noticed at once; a hung one dumps its stacks into trainer.log first (rollout_guard.py)."""
        if self.guard is None:
            super().check_health(stale_after_s)
        else:
            self.guard.check(stale_after_s)

    def stop(self) -> None:
        """TRL sets the stop event, waits 15 s for the child, then terminates and kills it. agrpo: a failed or hung
        child is killed at once; the stop event is set only while the child lives, from a thread waited on for a
        bounded time (a child that died asleep on it makes `set()` wait forever: CPython #75158); and the queues are
        drained while TRL waits, so a child that queued samples nobody reads exits by itself instead of after 15 s."""
        if self.guard is None or self._process is None:
            self._stop_draining()
            return
        self.guard.signal_stop()
        event, self._stop_event_mp = self._stop_event_mp, _AlreadySet()
        try:
            self._stop_draining()  # TRL's join / terminate / kill
        finally:
            self._stop_event_mp = event

    def _stop_draining(self) -> None:
        with draining(self.rollout_buffer, self.metrics_queue):
            super().stop()
