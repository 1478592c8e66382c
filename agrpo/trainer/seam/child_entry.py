"""The rollout child's entry point when the guard is on (agrpo/trainer/rollout_guard.py): `AgrpoRolloutWorker` spawns
`ChildEntry` in TRL's `_child_main`'s place, which sets the child's logging up before TRL is imported and then runs
TRL's `_child_main` with a polling stop watcher.

This module does not import TRL at the top: the child unpickles `ChildEntry` before TRL's modules, which is what lets
it set up the child's logging before TRL (and vLLM, which TRL imports) log anything.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
from typing import Any

TRL_WORKER_MODULE = "trl.experimental.async_grpo.async_rollout_worker"


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
        """TRL's `_child_main`, whose stop watcher polls the stop event instead of sleeping in its Condition (a child
        that exits while registered as a sleeper makes the trainer's `set()` wait forever, CPython #75158). TRL has no
        argument for the watcher: `_child_main` calls its module's `_spawn_stop_watcher`, replaced here, in the
        child process only."""
        import importlib

        from agrpo.trainer.guarded_loop import poll_stop_event

        module = importlib.import_module(TRL_WORKER_MODULE)
        module._spawn_stop_watcher = poll_stop_event
        return module._child_main(*args, **kwargs)
