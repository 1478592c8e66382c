"""The rollout child's process-level protocol with the trainer: its heartbeat, its failure report and its exit.

Compared with TRL's child it never sleeps on a cross-process Condition (the stop watcher polls), never takes the
shared values' locks (a process that dies holding one blocks the other side: guard.py), and once a failure is
reported it exits at once instead of waiting for threads or queues nobody will read.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from agrpo.errors import AgrpoError
from agrpo.rewards.contract import describe_row, raised_at

STOP_POLL_S = 0.1


class RowError(AgrpoError):
    """A row's prompt could not be rendered through the chat template, or vLLM refused it."""


def row_failure(prompt: Any, error: BaseException) -> str:
    """The paragraph for a row whose completion could not be generated."""
    where = raised_at(error)
    status = getattr(error, "status", None)
    hint = (
        " vLLM refuses a prompt that does not fit: check that prompt tokens (with the tool list, in an agent run) + "
        "trainer.max_completion_length stay within inference.max_model_len"
        if status == 400
        else ""
    )
    return (
        f"generating a completion for the row [{describe_row({'prompts': [prompt]})}] failed: "
        f"{type(error).__name__}: {error}" + (f" ({where})" if where and status is None else "") + f".{hint}"
    )


class ProgressHeartbeat:
    """The child's heartbeat, held back to the start of a reward call that has not returned: generation keeps turning
    while a reward hangs whenever it is paced, and the trainer then saw a live child forever. The trainer's staleness
    check measures how long the oldest unfinished scoring has run."""

    def __init__(self, raw: Any):
        self.raw = raw  # the shared memory, without the value's lock (read and written whole: no lock needed)
        self.scoring_since: float | None = None

    @property
    def value(self) -> float:
        return self.raw.value

    @value.setter
    def value(self, now: float) -> None:
        self.raw.value = now if self.scoring_since is None else min(now, self.scoring_since)

    def beat(self) -> None:
        self.value = time.time()


def poll_stop_event(request_stop: Callable[[], None], stop_event: Any) -> None:
    """Call `request_stop` (from a thread) once the trainer sets `stop_event`, polling instead of sleeping in the
    event's Condition: a child that exits while registered as a sleeper makes the trainer's `set()` wait forever
    (CPython #75158)."""

    def watch() -> None:
        while not stop_event.is_set():
            time.sleep(STOP_POLL_S)
        request_stop()

    threading.Thread(target=watch, daemon=True, name="agrpo-stop-watcher").start()


def report(info_queue: Any, failed_event: Any, error: BaseException) -> None:
    """The failure protocol the trainer's guard reads: (type name, message, traceback) on the queue, then the event."""
    try:
        info_queue.put_nowait((type(error).__name__, str(error), traceback.format_exc()))
    except Exception:  # full: an earlier failure is already there
        pass
    failed_event.set()


def exit_now(info_queue: Any, data_queues: list[Any]) -> None:
    """End the child once its failure is on `info_queue`: the report is flushed into the pipe, scored samples nobody
    will train on are dropped (a full pipe would hold the exit), and no stuck thread can keep the process alive."""
    for data in data_queues:
        data.cancel_join_thread()
    info_queue.close()
    info_queue.join_thread()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
