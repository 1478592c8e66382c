"""A stand-in for the trainer process in tests/trainer/test_trainer_sigterm.py: shared multiprocessing objects and a
spawned child (as the rollout worker has), then it waits for the launcher's SIGTERM to its process group."""

import multiprocessing as mp
import signal
import sys
import time

from agrpo.trainer.__main__ import Terminated, _terminated


def wait_for(event) -> None:
    event.wait()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(3)]
    events = [ctx.Event() for _ in range(3)]
    values = [ctx.Value("d", 0.0) for _ in range(2)]
    child = ctx.Process(target=wait_for, args=(events[0],), daemon=True)
    child.start()
    if sys.argv[1] == "guarded":
        signal.signal(signal.SIGTERM, _terminated)  # what `python -m agrpo.trainer` installs
    print("ready", flush=True)
    try:
        time.sleep(120)
    except Terminated:
        child.join(10)  # it got the SIGTERM too (same process group) and is gone
        sys.exit(143)
