"""The launcher stops a trainer with SIGTERM to its process group (agrpo/processes/managed.py). Killed by the signal's
default action, the trainer left its multiprocessing queues, events and values (TRL's rollout worker's) to Python's
resource tracker, which warned "There appear to be 26 leaked semaphore objects to clean up at shutdown". The trainer
now turns SIGTERM into an exception that unwinds it (agrpo/trainer/__main__.py): nothing is leaked.

A stand-in process (tests/trainer/sigterm_child.py) holds the same kinds of objects and a spawned child; the
launcher's side is the real `stop_all`. The unguarded run shows the warning this test guards against."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agrpo.processes.managed import ManagedProcess, stop_all
from agrpo.processes.watchdog import group_members

STAND_IN = Path(__file__).with_name("sigterm_child.py")
BOUND_POLLS = 600  # 0.1 s apart: a bound on waits that must end, never a timing assertion


def stopped_like_the_launcher_does(mode: str, tmp_path) -> tuple[int, str]:
    """SIGTERM to the stand-in's process group, as `stop_all` sends it; then, before the group is reaped, every
    member gets the time to end by itself (Python's resource tracker writes its warning as it ends)."""
    log = tmp_path / f"{mode}.log"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")]))}
    process = ManagedProcess("trainer", [sys.executable, str(STAND_IN), mode], env, log)
    process.start()
    try:
        for _ in range(BOUND_POLLS):
            if "ready" in log.read_text() or not process.alive():
                break
            time.sleep(0.1)
        assert "ready" in log.read_text(), log.read_text()
        process._signal_group(signal.SIGTERM)
        process.popen.wait(timeout=60)
        for _ in range(BOUND_POLLS):  # the members left (the tracker) end by themselves
            if not group_members(process.pid):
                break
            time.sleep(0.1)
    finally:
        stop_all([process], timeout_s=20.0)
    return process.popen.returncode, log.read_text()


@pytest.mark.parametrize(("mode", "code", "leaks"), [("guarded", 143, False), ("default", -15, True)])
def test_sigterm_unwinds_the_trainer_and_leaks_no_semaphore(tmp_path, mode, code, leaks):
    returncode, output = stopped_like_the_launcher_does(mode, tmp_path)
    assert returncode == code, output
    assert ("leaked semaphore" in output) is leaks, output
    assert "Traceback" not in output
