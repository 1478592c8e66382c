"""The rollout child's entry point: agrpo's rollout worker (worker.py) spawns `ChildEntry`, which sets the child's
logging up before TRL is imported, builds agrpo's rollout loop (loop.py) on the shared channels (process.py), signals
ready, and runs it with a polling stop watcher (child.py).

This module does not import TRL at the top: the child unpickles a process's target before its arguments (which import
TRL, and TRL imports vLLM), so unpickling `ChildEntry` sets up the child's logging first.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from typing import Any

# What a spawned child inherits from a distributed launch and must not act on: accelerate would join the trainer's
# process group. The child never touches a GPU either (a reward model runs on CPU there).
DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
DISTRIBUTED_ENV += ("ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
DISTRIBUTED_ENV += ("TORCHELASTIC_MAX_RESTARTS", "TORCH_FR_DUMP_TEMP_FILE", "NCCL_DEBUG_FILE")
NO_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def child_environment(environ: dict[str, str]) -> None:
    """The rollout child's environment: single-process, no GPU (in place)."""
    for name in DISTRIBUTED_ENV:
        environ.pop(name, None)
    for name in NO_GPU_ENV:
        environ[name] = ""


def _setup_child(run_dir: str | None, level: str) -> None:
    """In the rollout child, before TRL is imported: log like the trainer (trainer.log + the console filter), and
    dump every thread's stack into trainer.log on SIGUSR1 (the trainer asks before it kills a hung child)."""
    child_environment(os.environ)
    if run_dir is None:  # a worker outside a run (benchmarks/rollout_timing.py): logging as the process has it
        return
    from agrpo.trainer.console.logs import setup_trainer_logging

    log_file = setup_trainer_logging(run_dir, level)
    dump = open(log_file, "a")  # kept open for the life of the process (faulthandler writes to it)
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)


def _child_entry_in_child(run_dir: str | None, level: str) -> ChildEntry:
    _setup_child(run_dir, level)
    return ChildEntry(run_dir, level)


class ChildEntry:
    """The rollout child's target. Unpickling it (first, in the child) sets the child's environment and logging up."""

    def __init__(self, run_dir: str | None, level: str):
        self.run_dir = run_dir
        self.level = level

    def __reduce__(self):
        return (_child_entry_in_child, (self.run_dir, self.level))

    def __call__(self, loop_settings: dict[str, Any], channels: Any) -> None:
        """Build the loop on the channels (a loop that cannot be built - a chat template TRL's parser does not know,
        say - is reported like any failure), say ready, watch the stop event, run."""
        from agrpo.trainer.rollout.child import exit_now, poll_stop_event, report
        from agrpo.trainer.rollout.loop import RolloutLoop

        try:
            rollout_loop = RolloutLoop(channels, **loop_settings)
        except Exception as error:
            logging.getLogger(__name__).debug("the rollout loop could not be built", exc_info=True)
            report(channels.failure, channels.failed, error)
            exit_now(channels.failure, [channels.samples, channels.metrics])
        channels.ready.set()
        poll_stop_event(rollout_loop.request_stop, channels.stop)
        rollout_loop.run()
