"""The rollout worker, made to fail loudly and never hang: a failing reward, a bad row, a dead or hung rollout
process ends the run within seconds with one paragraph, a non-zero exit, and everything written so far kept.

TRL 1.16 generates and scores in a spawned child process (`AsyncRolloutWorker`). Before this guard, a reward that
raised hung the run forever. The root cause: the child's stop watcher thread sleeps in `stop_event.wait()`, which
registers it as a sleeper of the event's multiprocessing Condition; when the reward's exception ended the child,
that sleeper died registered, and the trainer's `stop()` called `stop_event.set()`, whose `notify_all()` waits for
every registered sleeper to acknowledge its wake-up - forever (CPython issue #75158, open since 2017). What the guard
changes (each piece names the failure it removes):

- the child never sleeps on a cross-process Condition: its stop watcher polls the event instead, and it reads and
  writes the shared version and heartbeat values without their locks (a process that dies holding one of those locks
  would block the other side just the same) - agrpo/trainer/rollout/child.py, its watcher installed by
  agrpo/trainer/rollout/entry.py;
- the trainer sets the stop event only while the child lives, from a helper thread it waits on for a bounded time,
  and kills a child that failed, died or hung instead of waiting 15 s for it;
- a failure is reported as one paragraph (`RewardError` names the term, the error and the row; a row that cannot be
  rendered or generated is named too), the child's pending work is cancelled before its event loop closes (no
  "Task was destroyed but it is pending!"), its traceback goes to trainer.log, and it exits at once;
- the trainer notices a failure at the end of every step and whenever it waits for samples, a child that died
  without a word (killed, out of memory, a crash in native code) at once, and a child whose heartbeat stopped for
  `heartbeat_stale_after_s` (TRL's setting: `trainer.extra.heartbeat_stale_after_s`, default 300 s), after asking it
  to dump every thread's stack into trainer.log.

`guard_rollout_worker(trainer)` guards one built AgrpoAsyncGRPOTrainer's worker: `AgrpoRolloutWorker`'s `start`,
`check_health` and `stop` (agrpo/trainer/rollout/worker.py, TRL's public rollout-worker protocol) call the
`RolloutGuard` here; the child's side starts in agrpo/trainer/rollout/entry.py.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from agrpo.errors import AgrpoError

log = logging.getLogger(__name__)

STACK_DUMP_WAIT_S = 1.0  # for a hung child to write its stacks into trainer.log before it is killed
# Reported failures that are already one paragraph: their message is shown as it is.
PARAGRAPH_ERRORS = ("RewardError", "RowError", "RolloutFailed")
WORKER = "the rollout worker (the process that generates and scores completions)"


class RolloutFailed(AgrpoError):
    """The rollout worker failed, died or hung; the message says which, with what to do."""


# ---- the messages (pure) ----------------------------------------------------------------------------------------


def reported_message(type_name: str, message: str, log_file: str | None) -> str:
    """The paragraph for a failure the child reported (its exception's type name and message)."""
    if type_name in PARAGRAPH_ERRORS:
        return message
    where = f"; the traceback is in {log_file}" if log_file else ""
    return f"{WORKER} failed: {type_name}: {message}{where}"


def died_message(exitcode: int | None, log_file: str | None) -> str:
    """The paragraph for a child that ended without reporting anything."""
    how = f"was killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exited ({exitcode})"
    hint = " (SIGKILL: often the machine ran out of memory)" if exitcode == -signal.SIGKILL else ""
    where = f"; its last lines are in {log_file}" if log_file else ""
    return f"{WORKER} {how}{hint} without reporting an error{where}"


def hang_message(age_s: float, stale_after_s: float, log_file: str | None) -> str:
    """The paragraph for a child whose heartbeat stopped."""
    where = f" Where each of its threads was stuck is in {log_file}." if log_file else ""
    return (
        f"{WORKER} stopped responding: no heartbeat for {age_s:.0f} s (limit {stale_after_s:.0f} s). A reward or "
        f"a request is stuck.{where} If a reward is legitimately that slow, raise "
        "trainer.extra.heartbeat_stale_after_s"
    )


def with_progress(message: str, step: int, max_steps: int) -> str:
    sentence = message.rstrip().rstrip(".") + "."
    return f"{sentence} Training stopped at step {step} of {max_steps}."


# ---- the trainer's side -----------------------------------------------------------------------------------------


class RolloutGuard:
    """The trainer's half of the guard for one AgrpoRolloutWorker (see the module docstring); `progress()` is the
    trainer's (step, max_steps) for the paragraph. It reads the worker's own channels and child
    (agrpo/trainer/rollout/process.py), nothing of TRL's."""

    def __init__(
        self,
        worker: Any,
        progress: Callable[[], tuple[int, int]],
        run_dir: str | None,
        level: str,
        log_file: str | None,
    ):
        self.worker = worker
        self.progress = progress
        self.run_dir = run_dir
        self.level = level
        self.log_file = log_file
        self.failure: str | None = None
        self._reported: str | None = None

    def fail(self, message: str) -> RolloutFailed:
        step, max_steps = self.progress()
        self.failure = with_progress(message, step, max_steps)
        return RolloutFailed(self.failure)

    def reported(self) -> str | None:
        """The paragraph the child reported, if it set its failed event."""
        channels = self.worker.channels
        if self._reported is None and channels.failed.is_set():
            try:
                type_name, message, _traceback = channels.failure.get(timeout=2.0)
            except (queue.Empty, OSError, ValueError, EOFError):
                type_name, message = "unknown error", "no details arrived"
            self._reported = reported_message(type_name, message, self.log_file)
        return self._reported

    def exited(self, exitcode: int | None) -> Exception:
        """What a child that exited before it was ready raises: its own paragraph when it said why."""
        reported = self.reported()
        return self.fail(died_message(exitcode, self.log_file) if reported is None else reported)

    def check(self, stale_after_s: float | None = None) -> None:
        """Raise RolloutFailed if the child reported a failure or died; with `stale_after_s`, also if its heartbeat
        is older than that (only where the trainer waits for samples: a back-pressured child does not beat)."""
        reported = self.reported()
        if reported is not None:
            raise self.fail(reported)
        exitcode = self.worker.child.exitcode()
        if exitcode is not None:
            raise self.fail(died_message(exitcode, self.log_file))
        if stale_after_s is None:
            return
        age = self.worker.channels.beat_age()  # lockless: see the module docstring
        if age > stale_after_s:
            process = self.worker.child.process
            if process is not None and process.pid:
                os.kill(process.pid, signal.SIGUSR1)  # its stacks, into trainer.log
                time.sleep(STACK_DUMP_WAIT_S)
            raise self.fail(hang_message(age, stale_after_s, self.log_file))


class RolloutWatchdog(TrainerCallback):
    """After every optimizer step, end the run if the rollout child failed or died (the trainer may still be
    training on samples it had queued before the failure). The step ends first, so a checkpoint due at this step
    is still written; the failure is raised when training ends."""

    def __init__(self, guard: RolloutGuard):
        self.guard = guard
        self.failed: RolloutFailed | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.worker.child.process is None or self.failed is not None:
            return
        try:
            self.guard.check()
        except RolloutFailed as failed:
            self.failed = failed
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self.failed is not None:
            raise self.failed


def guard_rollout_worker(trainer: Any, run_dir: str, level: str = "INFO", log_file: str | None = None) -> None:
    """Guard a built AgrpoAsyncGRPOTrainer's rollout worker (main process only; others have none). The child's half is
    agrpo's rollout loop (loop.py, child.py: the heartbeat, the failure report, the exit)."""
    worker = getattr(trainer, "rollout_worker", None)
    if worker is None:
        return
    from agrpo.trainer.console.logs import current_log_file

    def progress() -> tuple[int, int]:
        return trainer.state.global_step, trainer.state.max_steps

    guard = RolloutGuard(worker, progress, run_dir, level, log_file or current_log_file())
    worker.watch(guard)
    trainer.add_callback(RolloutWatchdog(guard))
