"""The rollout loop class (agrpo/trainer/loop_install.py) on agrpo's real AgrpoRolloutWorker (rollout_worker.py), without
vLLM: which class each kind of run spawns, the order its concerns are composed in, that the child can import
it by name, and that the guard and the pacing installed around it leave it as it is. What each concern does in a run
is proven end to end by tests/e2e/test_failing_reward.py (guard), test_pipeline.py (pacing) and test_agent.py."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

from agrpo.trainer.agent_loop import AgentRolloutLoop, AgentTurnsMixin
from agrpo.trainer.guarded_loop import GuardedRolloutLoop
from agrpo.trainer.loop_install import loop_class
from agrpo.trainer.rollout_child import PacedRolloutLoop, PacingMixin
from agrpo.trainer.rollout_loop import AgrpoRolloutLoop


def worker_running(loop_cls: type):
    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker, RolloutLoopSpec

    return AgrpoRolloutWorker(RolloutLoopSpec(loop_cls), queue_maxsize=4)


def paced_trainer(worker):
    """What attach_pacing uses of AgrpoAsyncGRPOTrainer: its worker, queue, args and `pace_with` (the real method)."""
    from functools import partial

    from agrpo.trainer.seam.trainer import AgrpoAsyncGRPOTrainer

    trainer = SimpleNamespace(
        rollout_worker=worker,
        rollout_queue=worker.rollout_buffer,
        rollout_control=None,
        args=SimpleNamespace(max_staleness=1),
        state=SimpleNamespace(global_step=0, max_steps=1),
        add_callback=lambda callback: None,
    )
    trainer.pace_with = partial(AgrpoAsyncGRPOTrainer.pace_with, trainer)
    return trainer


@pytest.mark.parametrize(
    ("agent", "paced", "expected"),
    [
        (False, False, GuardedRolloutLoop),
        (False, True, PacedRolloutLoop),
        (True, False, AgentRolloutLoop),
        (True, True, AgentRolloutLoop),
    ],
)
def test_each_kind_of_run_spawns_its_loop(agent, paced, expected):
    assert loop_class(agent, paced) is expected and issubclass(expected, GuardedRolloutLoop)


def test_the_concerns_compose_in_one_order():
    """Outermost first: the agent's turn counters, pacing, the guard, agrpo's token and retired versions, TRL's loop."""
    order = [AgentTurnsMixin, PacingMixin, GuardedRolloutLoop, AgrpoRolloutLoop, _AsyncRolloutLoop]
    mro = AgentRolloutLoop.__mro__
    assert [mro.index(cls) for cls in order] == sorted(mro.index(cls) for cls in order)
    assert PacedRolloutLoop.__mro__[1:4] == (PacingMixin, GuardedRolloutLoop, AgrpoRolloutLoop)


@pytest.mark.parametrize("cls", [GuardedRolloutLoop, PacedRolloutLoop, AgentRolloutLoop])
def test_the_child_imports_each_loop_by_name(cls):
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls


def test_a_rank_without_a_rollout_worker_paces_nothing():
    from agrpo.trainer.rollout.pacing import attach_pacing

    with attach_pacing(SimpleNamespace(rollout_worker=None), auto=True) as controller:
        assert controller is None


def test_guard_and_pacing_leave_the_installed_loop_as_it_is():
    from agrpo.trainer.rollout.control import CountingQueue
    from agrpo.trainer.rollout.guard import guard_rollout_worker
    from agrpo.trainer.rollout.pacing import attach_pacing

    worker = worker_running(loop_class(agent=True, paced=True))
    trainer = paced_trainer(worker)
    guard_rollout_worker(trainer, run_dir="unused", log_file="/run/logs/trainer.log")
    with attach_pacing(trainer, auto=False) as controller:
        assert controller is None and worker.loop.loop_cls is AgentRolloutLoop
        assert set(worker.loop.kwargs) >= {"agrpo_control", "agrpo_max_staleness"}  # what PacingMixin takes
        assert worker.loop.kwargs["agrpo_control"] == trainer.rollout_control.path
        assert isinstance(trainer.rollout_queue, CountingQueue)  # the trainer's consumption is counted
    assert trainer.rollout_control is None


def test_pacing_refuses_a_loop_that_cannot_take_its_arguments():
    from agrpo.trainer.rollout.pacing import attach_pacing

    worker = worker_running(loop_class(agent=False, paced=False))
    trainer = paced_trainer(worker)
    with pytest.raises(RuntimeError, match="GuardedRolloutLoop, which cannot be paced"):
        with attach_pacing(trainer, auto=False):
            pass
    assert "agrpo_control" not in worker.loop.kwargs and trainer.rollout_control is None
