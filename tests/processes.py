"""Find a run's processes by its marker (AGRPO_RUN_TOKEN in /proc/<pid>/environ), not by command line: vLLM renames
its engine core ("VLLM::EngineCore") and its command line names nothing of the run."""

from __future__ import annotations

import os
import time

from agrpo.launchers.watchdog import carries_token


def marked_processes(token: str) -> dict[int, str]:
    """pid -> name (/proc/<pid>/comm) of every live process whose environment carries AGRPO_RUN_TOKEN=`token`."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not carries_token(int(entry), token):
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie waiting for its parent to reap it holds nothing
            with open(f"/proc/{entry}/comm") as comm:
                found[int(entry)] = comm.read().strip()
        except OSError:
            continue
    return found


def wait_for_marked(token: str, predicate, timeout_s: float = 120.0, poll_s: float = 0.5) -> dict[int, str]:
    """Poll until `predicate(marked processes)` holds; return them (the last ones seen if it never does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = marked_processes(token)
        if predicate(found) or time.monotonic() > deadline:
            return found
        time.sleep(poll_s)


def left_behind(token: str, timeout_s: float = 60.0) -> dict[int, str]:
    """The run's processes still alive after up to `timeout_s` (a bounded wait, not a timed assertion: teardown
    takes vLLM a few seconds); empty when everything is gone."""
    return wait_for_marked(token, lambda found: not found, timeout_s)
