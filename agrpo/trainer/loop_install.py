"""Which rollout loop class TRL's rollout child runs, decided in this one place.

TRL's `AsyncRolloutWorker` spawns its `_loop_cls` in a child process and hands it the class by reference, so the
class must be one the child can import by name: agrpo's loop is a fixed chain of module-level classes, each adding
one concern in its own module, and this module picks how far along the chain a run goes:

1. `AgrpoRolloutLoop` (rollout_loop.py): TRL's loop with the bearer token, retired versions dropped at once and its
   log in trainer.log. The class default of `AgrpoRolloutWorker` (agrpo/trainer/seam/worker.py), so a worker built
   outside a run (benchmarks/rollout_timing.py) still carries the token.
2. `GuardedRolloutLoop` (guarded_loop.py): a failing reward, a bad row or a hung child ends the run. Every run.
3. `PacedRolloutLoop` (rollout_child.py): pacing and per-rollout versions, with `trainer.max_inflight_tasks=auto` or
   `sync.mode=background` (rollout_pacing.py then hands it the control block it reads).
4. `AgentRolloutLoop` (agent_loop.py): per-turn routing counters, with tools or an environment. It derives from the
   paced loop, whose pacing stays off without the control block (its per-rollout versions apply).

`AgrpoAsyncGRPOTrainer` (agrpo/trainer/seam/trainer.py) gives its worker `loop_class(...)` when it is built, before
anything else touches the worker (the guard and the pacing add their parts around that loop).
"""

from __future__ import annotations

from agrpo.trainer.agent_loop import AgentRolloutLoop
from agrpo.trainer.guarded_loop import GuardedRolloutLoop
from agrpo.trainer.rollout_child import PacedRolloutLoop


def loop_class(agent: bool, paced: bool) -> type[GuardedRolloutLoop]:
    """The loop a run's rollout child runs: guarded always, paced when `paced`, with the agent's counters for an
    agent (which carry the paced loop's class in either case)."""
    if agent:
        return AgentRolloutLoop
    return PacedRolloutLoop if paced else GuardedRolloutLoop


def loop_to_run(current: type, wanted: type) -> type:
    """The loop a worker that runs `current` spawns once `wanted` is asked for: `wanted` where it extends `current`
    (TRL's loop, or an earlier step of agrpo's chain), `current` where that extends `wanted`; any other loop class
    would lose the guard, so it is refused."""
    if issubclass(current, wanted):
        return current
    if not issubclass(wanted, current):
        raise RuntimeError(
            f"the rollout worker already runs {current.__qualname__}: derive it from "
            "agrpo.trainer.guarded_loop.GuardedRolloutLoop so that failures still end the run"
        )
    return wanted
