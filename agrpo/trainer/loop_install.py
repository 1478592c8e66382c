"""Which rollout loop class TRL's rollout child runs, decided and installed in this one place.

TRL's `AsyncRolloutWorker` spawns `worker._loop_cls` in a child process and hands it the class by reference, so the
class must be one the child can import by name: agrpo's loop is a fixed chain of module-level classes, each adding
one concern in its own module, and this module picks how far along the chain a run goes:

1. `AgrpoRolloutLoop` (rollout_loop.py): TRL's loop with the bearer token, retired versions dropped at once and its
   log in trainer.log. The class default of every worker in this process (`install_default_loop`, one of the TRL
   patches of trl_patches.py), so a worker built outside `run_training` still carries the token.
2. `GuardedRolloutLoop` (guarded_loop.py): a failing reward, a bad row or a hung child ends the run. Every run.
3. `PacedRolloutLoop` (rollout_child.py): pacing and per-rollout versions, with `trainer.max_inflight_tasks=auto` or
   `sync.mode=background` (rollout_pacing.py then hands it the control block it reads).
4. `AgentRolloutLoop` (agent_loop.py): per-turn routing counters, with tools or an environment. It derives from the
   paced loop, whose pacing stays off without the control block (its per-rollout versions apply).

`install_rollout_loop` runs once, on the built trainer, before anything else touches its worker (the guard of
rollout_guard.py and the pacing of rollout_pacing.py add their parts around the loop installed here).
"""

from __future__ import annotations

import os
from typing import Any

from agrpo.trainer.agent_loop import AgentRolloutLoop
from agrpo.trainer.guarded_loop import GuardedRolloutLoop
from agrpo.trainer.rollout_child import PacedRolloutLoop
from agrpo.trainer.rollout_loop import ROLLOUT_LOG_ENV, AgrpoRolloutLoop


def loop_class(agent: bool, paced: bool) -> type[GuardedRolloutLoop]:
    """The loop a run's rollout child runs: guarded always, paced when `paced`, with the agent's counters for an
    agent (which carry the paced loop's class in either case)."""
    if agent:
        return AgentRolloutLoop
    return PacedRolloutLoop if paced else GuardedRolloutLoop


def install_loop(worker: Any, loop_cls: type) -> None:
    """Make `worker` (or, given the worker class, every worker) spawn `loop_cls`. A loop that `loop_cls` extends
    (TRL's, or an earlier step of agrpo's chain) is replaced; one that extends `loop_cls` is kept; any other loop
    class would lose the guard, so it is refused."""
    current = worker._loop_cls
    if issubclass(current, loop_cls):
        return
    if not issubclass(loop_cls, current):
        raise RuntimeError(
            f"the rollout worker already runs {current.__qualname__}: derive it from "
            "agrpo.trainer.guarded_loop.GuardedRolloutLoop so that failures still end the run"
        )
    worker._loop_cls = loop_cls


def install_default_loop() -> None:
    """Every AsyncRolloutWorker of this process spawns AgrpoRolloutLoop, which logs where the trainer does."""
    from trl.experimental.async_grpo import async_rollout_worker

    from agrpo.trainer.logs import current_log_file

    install_loop(async_rollout_worker.AsyncRolloutWorker, AgrpoRolloutLoop)
    log_file = current_log_file()
    if log_file:  # the spawned child reads its environment: it logs where the trainer does
        os.environ[ROLLOUT_LOG_ENV] = log_file


def install_rollout_loop(trainer: Any, *, agent: bool, paced: bool) -> type | None:
    """Install the run's loop class on a built AsyncGRPOTrainer's rollout worker; the class installed, or None on a
    rank without a worker (only the main process has one)."""
    worker = getattr(trainer, "rollout_worker", None)
    if worker is None:
        return None
    install_loop(worker, loop_class(agent=agent, paced=paced))
    return worker._loop_cls
