"""A full disk under the run folder ends the trainer with one paragraph (disk_full.py, trainer_error.py), and nothing
else on the console: no traceback from the threads and the log file that meet the full disk first.

Before (issue 42), filling the disk under a running trainer printed: TensorBoard's writer thread's traceback
(threading's default hook: "Exception in thread ..."), the same error again where the main thread met it
(seam/trainer.py `log`), and "--- Logging error ---" with a traceback and the whole call stack for every record
trainer.log could not take; trainer_error.txt was left empty. Here:
- `thread_hook`: a disk-full error in any thread is not printed; its traceback is kept beside the paragraph (a
  folder with room, trainer_error.spill_file) and logging's own error printout is switched off (the disk is full:
  every later record would print one); the main thread meets the same error at its next write and ends the run.
- `QuietFileHandler`: trainer.log's handler for agrpo/trainer/console/logs.py: its first write that fails on a full disk
  says one line on stderr, later ones nothing; any other logging error prints as Python prints it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from typing import Any

from agrpo.trainer.disk_full import disk_full_cause
from agrpo.trainer.trainer_error import TRAINER_ERROR_ENV, spill_file, write_whole

_previous_hook = threading.excepthook
_hooks_running = threading.Condition()
_hooks_in_flight = 0


def on_disk_full(error: BaseException, where: str) -> None:
    """The disk is full: later logging errors are not printed, and this traceback is kept in the spill folder."""
    logging.raiseExceptions = False  # each record trainer.log can no longer take would print a traceback
    path = os.environ.get(TRAINER_ERROR_ENV)
    target = spill_file(path, f".{where}.traceback.txt") if path else None
    if target is not None:  # whole or not at all; when the temp disk is full too, the paragraph still says it
        write_whole(target, "".join(traceback.format_exception(error)))


def thread_hook(args: Any) -> None:
    """threading.excepthook: a thread that died of a full disk (TensorBoard's writer) is not printed."""
    global _hooks_in_flight
    if args.exc_value is None or disk_full_cause(args.exc_value) is None:
        _previous_hook(args)
        return
    with _hooks_running:
        _hooks_in_flight += 1
    try:
        on_disk_full(args.exc_value, "thread")
    finally:
        with _hooks_running:
            _hooks_in_flight -= 1
            _hooks_running.notify_all()


def settle_thread_hooks(timeout: float = 2.0) -> bool:
    """Wait (bounded) for threads still keeping their disk-full traceback: TensorBoard's writer thread hands its
    error to the main thread before its hook runs, and the main thread's exit would otherwise cut that write short."""
    with _hooks_running:
        return _hooks_running.wait_for(lambda: _hooks_in_flight == 0, timeout)


def install_thread_hook() -> None:
    """Idempotent; other threads' errors still reach the hook that was there before."""
    threading.excepthook = thread_hook


class QuietFileHandler(logging.FileHandler):
    """A log file on a disk that may fill: the first record it cannot write for that reason says one line on stderr
    (naming the file), later ones are dropped silently; other errors are handled as logging always does."""

    full = False

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if error is None or disk_full_cause(error) is None:
            super().handleError(record)
            return
        if not self.full:
            self.full = True
            on_disk_full(error, "log")
            sys.stderr.write(f"agrpo trainer: {self.baseFilename}: the disk is full; no more lines are written there\n")

    def close(self) -> None:
        """Closing flushes what the full disk did not take: that fails the same way, and is not an error to print."""
        try:
            super().close()
        except OSError as error:
            if disk_full_cause(error) is None:
                raise
