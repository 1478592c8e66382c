"""Targets for the processes that tests/trainer/rollout/test_rollout_guard.py spawns: a module that imports nothing
heavy, so that a spawned child starts in a fraction of a second."""

from __future__ import annotations

import os
import threading
import time


def asleep_on_event_then_exit(event, ready) -> None:
    """A child whose thread is asleep in `event.wait()` when the process ends, as TRL's stop watcher was when a
    reward's exception ended the rollout child."""
    threading.Thread(target=event.wait, daemon=True).start()
    time.sleep(1.0)  # the thread is registered as a sleeper of the event's Condition by now
    ready.set()


def wait_for_stop(event, ready) -> None:
    ready.set()
    event.wait()


def exit_with(code: int) -> None:
    os._exit(code)
