"""What vLLM's shutdown does to its engine core, without vLLM: a spawned process makes a multiprocessing RLock (as tqdm
does for vLLM's weight loader in the engine core) and is SIGKILLed (vLLM's `--shutdown-timeout 0`: SIGTERM, then
SIGKILL at once), so Python's resource tracker finds the lock's semaphore still registered when the run ends. Then
one unrelated warning, which no filter may hide. Run by tests/inference/test_vllm_server.py."""

import multiprocessing
import os
import signal
import time
import warnings


def engine_core(ready) -> None:
    lock = multiprocessing.get_context("spawn").RLock()  # a spawned process's lock: registered with the tracker
    ready.set()
    time.sleep(60)
    del lock  # held until the end, as tqdm holds its lock for the life of the process


if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    core = spawn.Process(target=engine_core, args=(ready,))
    core.start()
    assert ready.wait(60), "the stand-in engine core did not start"
    os.kill(core.pid, signal.SIGKILL)
    core.join()
    warnings.warn("an unrelated warning, still shown")
