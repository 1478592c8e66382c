"""A call bounded in time without a process: the one shape agrpo uses for user code that may hang (a tool, an
environment, a dataset loader)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def call_within(
    run: Callable[[], Any], timeout_s: float, thread_name: str, timed_out: Callable[[], BaseException]
) -> Any:
    """`run()` in a daemon thread, waiting at most `timeout_s`, then raising `timed_out()`: a hung call leaves only
    that thread behind, which neither blocks the caller nor keeps the process alive at exit. What `run()` raises is
    raised as it is."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = run()
        except BaseException as error:  # handed to the caller, which re-raises it
            box["error"] = error

    thread = threading.Thread(target=target, name=thread_name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise timed_out()
    if "error" in box:
        raise box["error"]
    return box["result"]
