"""The one install step of the rollout loop class (agrpo/trainer/loop_install.py) on TRL's real AsyncRolloutWorker,
without vLLM: which class each kind of run spawns, the order its concerns are composed in, that the child can import
it by name, and that the guard and the pacing installed around it leave it as it is. What each concern does in a run
is proven end to end by tests/e2e/test_failing_reward.py (guard), test_pipeline.py (pacing) and test_agent.py."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

from agrpo.trainer.agent_loop import AgentRolloutLoop, AgentTurnsMixin
from agrpo.trainer.guarded_loop import GuardedRolloutLoop
from agrpo.trainer.loop_install import install_loop, install_rollout_loop, loop_class
from agrpo.trainer.rollout_child import PacedRolloutLoop, PacingMixin
from agrpo.trainer.rollout_loop import AgrpoRolloutLoop


@pytest.fixture()
def worker():
    from agrpo.trainer.cpu_compat import apply_cpu_workarounds

    apply_cpu_workarounds()  # TRL refuses to build the worker without an importable vllm unless patched
    from accelerate.state import PartialState
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    PartialState()
    return AsyncRolloutWorker(queue_maxsize=4)


@pytest.mark.parametrize(
    ("agent", "paced", "expected"),
    [
        (False, False, GuardedRolloutLoop),
        (False, True, PacedRolloutLoop),
        (True, False, AgentRolloutLoop),
        (True, True, AgentRolloutLoop),
    ],
)
def test_each_kind_of_run_spawns_its_loop(worker, agent, paced, expected):
    trainer = SimpleNamespace(rollout_worker=worker)
    assert install_rollout_loop(trainer, agent=agent, paced=paced) is expected
    assert worker._loop_cls is expected and loop_class(agent, paced) is expected


def test_the_concerns_compose_in_one_order():
    """Outermost first: the agent's turn counters, pacing, the guard, agrpo's token and retired versions, TRL's loop."""
    order = [AgentTurnsMixin, PacingMixin, GuardedRolloutLoop, AgrpoRolloutLoop, _AsyncRolloutLoop]
    mro = AgentRolloutLoop.__mro__
    assert [mro.index(cls) for cls in order] == sorted(mro.index(cls) for cls in order)
    assert PacedRolloutLoop.__mro__[1:4] == (PacingMixin, GuardedRolloutLoop, AgrpoRolloutLoop)


@pytest.mark.parametrize("cls", [GuardedRolloutLoop, PacedRolloutLoop, AgentRolloutLoop])
def test_the_child_imports_each_loop_by_name(cls):
    assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls


def test_a_loop_that_extends_the_chosen_one_is_kept_and_anything_else_refused(worker):
    class Mine(PacedRolloutLoop):
        pass

    worker._loop_cls = Mine
    install_loop(worker, PacedRolloutLoop)
    assert worker._loop_cls is Mine

    class Other(_AsyncRolloutLoop):
        pass

    worker._loop_cls = Other
    with pytest.raises(RuntimeError, match="Other: derive it from agrpo.trainer.guarded_loop.GuardedRolloutLoop"):
        install_rollout_loop(SimpleNamespace(rollout_worker=worker), agent=False, paced=False)
    assert worker._loop_cls is Other


def test_a_rank_without_a_rollout_worker_installs_nothing():
    assert install_rollout_loop(SimpleNamespace(rollout_worker=None), agent=True, paced=True) is None


def test_guard_and_pacing_leave_the_installed_loop_as_it_is(worker):
    from agrpo.trainer.rollout_guard import guard_rollout_worker
    from agrpo.trainer.rollout_pacing import attach_pacing

    trainer = SimpleNamespace(
        rollout_worker=worker,
        rollout_queue=worker.rollout_buffer,
        args=SimpleNamespace(max_staleness=1),
        state=SimpleNamespace(global_step=0, max_steps=1),
        add_callback=lambda callback: None,
    )
    install_rollout_loop(trainer, agent=True, paced=True)
    guard_rollout_worker(trainer, run_dir="unused", log_file="/run/logs/trainer.log")
    with attach_pacing(trainer, auto=False) as controller:
        assert controller is None and worker._loop_cls is AgentRolloutLoop
        assert set(worker._loop_kwargs) >= {"agrpo_control", "agrpo_max_staleness"}  # what PacingMixin takes


def test_pacing_refuses_a_loop_that_cannot_take_its_arguments(worker):
    from agrpo.trainer.rollout_pacing import attach_pacing

    trainer = SimpleNamespace(rollout_worker=worker)
    install_rollout_loop(trainer, agent=False, paced=False)
    with pytest.raises(RuntimeError, match="GuardedRolloutLoop, which cannot be paced"):
        with attach_pacing(trainer, auto=False):
            pass
