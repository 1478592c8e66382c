"""TRL's rollout worker, made to fail loudly and never hang: a failing reward, a bad row, a dead or hung rollout
process ends the run within seconds with one paragraph, a non-zero exit, and everything written so far kept.

TRL 1.16 generates and scores in a spawned child process (`AsyncRolloutWorker`). Before this guard, a reward that
raised hung the run forever. The root cause: the child's stop watcher thread sleeps in `stop_event.wait()`, which
registers it as a sleeper of the event's multiprocessing Condition; when the reward's exception ended the child,
that sleeper died registered, and the trainer's `stop()` called `stop_event.set()`, whose `notify_all()` waits for
every registered sleeper to acknowledge its wake-up - forever (CPython issue #75158, open since 2017). What the guard
changes (each piece names the failure it removes):

- the child never sleeps on a cross-process Condition: its stop watcher polls the event instead, and it reads and
  writes the shared version and heartbeat values without their locks (a process that dies holding one of those locks
  would block the other side just the same) - agrpo/trainer/guarded_loop.py, installed by loop_install.py;
- the trainer sets the stop event only while the child lives, from a helper thread it waits on for a bounded time,
  and kills a child that failed, died or hung instead of waiting 15 s for it;
- a failure is reported as one paragraph (`RewardError` names the term, the error and the row; a row that cannot be
  rendered or generated is named too), the child's pending work is cancelled before its event loop closes (no
  "Task was destroyed but it is pending!"), its traceback goes to trainer.log, and it exits at once;
- the trainer notices a failure at the end of every step and whenever it waits for samples, a child that died
  without a word (killed, out of memory, a crash in native code) at once, and a child whose heartbeat stopped for
  `heartbeat_stale_after_s` (TRL's setting: `trainer.extra.heartbeat_stale_after_s`, default 300 s), after asking it
  to dump every thread's stack into trainer.log.

`guard_rollout_worker(trainer)` installs all of it on one built AsyncGRPOTrainer (the worker's own methods; nothing
global in this process). This module does not import TRL at the top: the child unpickles `ChildEntry` before TRL's
modules, which is what lets it set up the child's logging before TRL (and vLLM, which TRL imports) log anything.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import queue
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from transformers import TrainerCallback

from agrpo.errors import AgrpoError

log = logging.getLogger(__name__)

TRL_WORKER_MODULE = "trl.experimental.async_grpo.async_rollout_worker"
# Seconds the trainer waits for its stop signal to reach a living child, then for a failed child to exit.
STOP_SIGNAL_WAIT_S = 5.0
KILL_WAIT_S = 5.0
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


# ---- the child's entry point ------------------------------------------------------------------------------------


def _setup_child(run_dir: str, level: str) -> None:
    """In the rollout child, before TRL is imported: log like the trainer (trainer.log + the console filter), keep
    TRL's own "Worker process failed" traceback in the file (the trainer shows the failure as one paragraph), and
    dump every thread's stack into trainer.log on SIGUSR1 (the trainer asks before it kills a hung child)."""
    from agrpo.trainer.logs import setup_trainer_logging

    log_file = setup_trainer_logging(run_dir, level)
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.addFilter(_FileOnly())
    dump = open(log_file, "a")  # kept open for the life of the process (faulthandler writes to it)
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)


class _FileOnly(logging.Filter):
    """Keeps TRL's traceback of a failed worker out of the terminal: the trainer reports it as one paragraph."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == TRL_WORKER_MODULE and "Worker process failed" in record.getMessage())


def _child_entry_in_child(run_dir: str, level: str) -> "ChildEntry":
    _setup_child(run_dir, level)
    return ChildEntry(run_dir, level)


class ChildEntry:
    """Stands in for TRL's `_child_main` as the rollout child's target. The child unpickles a process's target before
    its arguments (which import TRL, and TRL imports vLLM), so unpickling this sets the child's logging up first."""

    def __init__(self, run_dir: str, level: str):
        self.run_dir = run_dir
        self.level = level

    def __reduce__(self):
        return (_child_entry_in_child, (self.run_dir, self.level))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import importlib

        return importlib.import_module(TRL_WORKER_MODULE)._child_main(*args, **kwargs)


@contextmanager
def child_entry(run_dir: str, level: str) -> Iterator[None]:
    """TRL's `start()` names `_child_main` as the target: swap in `ChildEntry` for the duration of one start."""
    import importlib

    module = importlib.import_module(TRL_WORKER_MODULE)
    original = module._child_main
    module._child_main = ChildEntry(run_dir, level)
    try:
        yield
    finally:
        module._child_main = original


# ---- the trainer's side -----------------------------------------------------------------------------------------


class _Guard:
    """The methods installed on one AsyncRolloutWorker (see the module docstring)."""

    def __init__(self, worker: Any, trainer: Any, run_dir: str, level: str, log_file: str | None):
        self.worker = worker
        self.trainer = trainer
        self.run_dir = run_dir
        self.level = level
        self.log_file = log_file
        self.failure: str | None = None
        self._reported: str | None = None

    def fail(self, message: str) -> RolloutFailed:
        state = self.trainer.state
        self.failure = with_progress(message, state.global_step, state.max_steps)
        return RolloutFailed(self.failure)

    def reported(self) -> str | None:
        """The paragraph the child reported, if it set its failed event."""
        worker = self.worker
        if self._reported is None and worker._failed_event.is_set():
            try:
                type_name, message, _traceback = worker._exception_info_queue.get(timeout=2.0)
            except (queue.Empty, OSError, ValueError, EOFError):
                type_name, message = "unknown error", "no details arrived"
            self._reported = reported_message(type_name, message, self.log_file)
        return self._reported

    def start(self) -> None:
        with child_entry(self.run_dir, self.level):
            try:
                type(self.worker).start(self.worker)
            except RuntimeError:  # TRL: "child exited during init"; the child may have said why
                reported = self.reported()
                if reported is None:
                    raise
                raise self.fail(reported) from None

    def check(self, stale_after_s: float | None = None) -> None:
        """Raise RolloutFailed if the child reported a failure or died; with `stale_after_s`, also if its heartbeat
        is older than that (only where the trainer waits for samples: a back-pressured child does not beat)."""
        reported = self.reported()
        if reported is not None:
            raise self.fail(reported)
        process = self.worker._process
        if process is not None and process.exitcode is not None:
            raise self.fail(died_message(process.exitcode, self.log_file))
        if stale_after_s is None:
            return
        age = time.time() - self.worker._heartbeat_value.get_obj().value  # lockless: see the module docstring
        if age > stale_after_s:
            if process is not None and process.pid:
                os.kill(process.pid, signal.SIGUSR1)  # its stacks, into trainer.log
                time.sleep(STACK_DUMP_WAIT_S)
            raise self.fail(hang_message(age, stale_after_s, self.log_file))

    def stop(self) -> None:
        worker, process = self.worker, self.worker._process
        if process is None:
            return
        if self.failure is not None and process.is_alive():  # failed, hung: nothing to wait for
            process.kill()
            process.join(KILL_WAIT_S)
        elif process.is_alive():
            setter = threading.Thread(target=worker._stop_event_mp.set, daemon=True, name="agrpo-stop-rollouts")
            setter.start()
            setter.join(STOP_SIGNAL_WAIT_S)  # a child that died meanwhile leaves set() blocked: let it be
        event, worker._stop_event_mp = worker._stop_event_mp, _AlreadySet()
        try:
            type(worker).stop(worker)  # TRL's join / terminate / kill (with agrpo's queue drain around it)
        finally:
            worker._stop_event_mp = event


class _AlreadySet:
    """The stop event as TRL's `stop()` sees it once the guard has signalled the child (or found it gone)."""

    def set(self) -> None:
        pass


class RolloutWatchdog(TrainerCallback):
    """After every optimizer step, end the run if the rollout child failed or died (the trainer may still be
    training on samples it had queued before the failure). The step ends first, so a checkpoint due at this step
    is still written; the failure is raised when training ends."""

    def __init__(self, guard: _Guard):
        self.guard = guard
        self.failed: RolloutFailed | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.worker._process is None or self.failed is not None:
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
    """Install the guard on a built AsyncGRPOTrainer's rollout worker (main process only; others have none). The
    child's half, GuardedRolloutLoop, is the worker's loop class by then (agrpo/trainer/loop_install.py)."""
    worker = getattr(trainer, "rollout_worker", None)
    if worker is None:
        return
    from agrpo.trainer.logs import current_log_file

    guard = _Guard(worker, trainer, run_dir, level, log_file or current_log_file())
    worker.start = guard.start
    worker.stop = guard.stop
    worker.check_health = guard.check  # TRL's dataset calls it with heartbeat_stale_after_s while it waits
    trainer.add_callback(RolloutWatchdog(guard))
