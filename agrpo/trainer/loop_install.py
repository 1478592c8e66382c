"""Which rollout loop class the rollout child runs, decided in this one place.

agrpo's rollout worker (agrpo/trainer/rollout_worker.py) spawns its loop class in a child process and hands it the
class by reference, so the class must be one the child can import by name: agrpo's loop is a fixed chain of
module-level classes, each adding one concern in its own module, and this module picks how far along the chain a run
goes:

1. `AgrpoRolloutLoop` (rollout_loop.py): TRL's loop with the bearer token, retired versions dropped at once and its
   log in trainer.log (a worker built outside a run, benchmarks/rollout_timing.py, may run it alone).
2. `GuardedRolloutLoop` (guarded_loop.py): a failing reward, a bad row or a hung child ends the run. Every run.
3. `PacedRolloutLoop` (rollout_child.py): pacing and per-rollout versions, with `trainer.max_inflight_tasks=auto` or
   `sync.mode=background` (rollout_pacing.py then hands it the control block it reads).
4. `AgentRolloutLoop` (agent_loop.py): per-turn routing counters, with tools or an environment. It derives from the
   paced loop, whose pacing stays off without the control block (its per-rollout versions apply).

`build_trainer` (agrpo/trainer/trl_backend.py) builds the worker with `loop_class(...)`, before anything else touches
it (the guard and the pacing add their parts around that loop).
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
