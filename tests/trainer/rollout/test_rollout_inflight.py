"""The in-flight controller as a pure policy: limits, single decisions (a table), and whole runs of figures."""

import pytest

from agrpo.config.schema.inference import FleetConfig
from agrpo.config.schema.trainer import fixed_inflight, is_auto
from agrpo.trainer.rollout.inflight import (
    MAX_WAIT_SHARE,
    WARMUP_STEPS,
    InflightController,
    Limits,
    StepFigures,
    Window,
    decide,
)

SMOKE = Limits(samples_per_step=16, group_size=8, weight_sync_steps=1, max_staleness=1)
ROOMY = Limits(samples_per_step=16, group_size=8, weight_sync_steps=1, max_staleness=2)  # ceiling 32


def test_limits_follow_the_staleness_bound():
    # the smoke recipe leaves no room: one step's worth is both the floor and the staleness bound
    assert (SMOKE.floor, SMOKE.initial, SMOKE.ceiling, SMOKE.settle_steps) == (16, 16, 16, 3)
    assert (ROOMY.floor, ROOMY.initial, ROOMY.ceiling) == (16, 32, 32)
    blog = Limits(samples_per_step=64, group_size=8, weight_sync_steps=4, max_staleness=4)
    assert (blog.floor, blog.initial, blog.ceiling) == (64, 4 * 64, 64 * 4 * 4)
    lock_step = Limits(samples_per_step=16, group_size=8, max_staleness=0)
    assert lock_step.floor == lock_step.ceiling == 16  # one version's worth
    tiny = Limits(samples_per_step=4, group_size=8, max_staleness=0)
    assert tiny.floor == tiny.initial == tiny.ceiling == 8  # never below one group: it could not finish


def test_auto_and_fixed_values():
    assert is_auto("auto") and is_auto(" AUTO ") and not is_auto("16")
    assert fixed_inflight("auto") is None and fixed_inflight("16") == 16 and fixed_inflight(7) == 7


def window(steps=3, step_s=1.0, wait_s=0.0, used=16.0, dropped=0.0, rollout_s=None) -> Window:
    return Window.of([StepFigures(step_s, wait_s, used, dropped, rollout_s)] * steps)


@pytest.mark.parametrize(
    "target, figures, cap, expected, why",
    [
        # drops above 5%: shrink by the share dropped (at least one sample), never below one step's worth
        (24, window(dropped=4.0), 32, 19, "dropped"),  # 12 of 60 = 20%: floor(24 x 0.8)
        (24, window(dropped=1.0), 32, 22, "dropped"),  # 5.9%: floor(24 x 0.94)
        (24, window(dropped=16.0), 32, 16, "dropped"),  # 50%: halved, up to the floor
        (16, window(dropped=16.0, wait_s=0.5), 32, 16, ""),  # at the floor: nothing left to shrink, hold
        # the trainer waits more than 2% (the fleet's release share) with (almost) no drops: grow, by the wait at most
        # x1.5
        (16, window(wait_s=0.2), 32, 20, "waited"),  # step 1.0 / busy 0.8 = x1.25
        (16, window(wait_s=0.6), 32, 24, "waited"),  # x2.5 capped at x1.5
        (16, window(wait_s=0.6), 18, 18, "waited"),  # capped by the learned cap
        (16, window(wait_s=0.6, rollout_s=0.4), 32, 20, "waited"),  # needed: 40 samples/s x 0.4 s x 1.25 = 20
        (31, window(wait_s=0.6), 32, 32, "waited"),  # the ceiling
        (32, window(wait_s=0.6), 32, 32, ""),  # at the cap: hold
        # a trainer that waits 5% (the case of docs/elastic.md's known conflict: 6-12% at the floor) is not fed: the
        # fleet would not release on it, so the budget grows (it held up to 10% before)
        (20, window(wait_s=0.05), 32, 22, "waited"),  # x1.053
        (16, window(wait_s=0.12), 31, 19, "waited"),  # at the floor after a straggler's drops: 16 x 1/0.88
        # the dead band: hold
        (20, window(wait_s=0.015), 32, 20, ""),  # 1.5% wait: fed, and the fleet may release
        (20, window(dropped=0.6), 32, 20, ""),  # 3.6% dropped: under 5%
        (20, window(dropped=0.6, wait_s=0.5), 32, 20, ""),  # waits, but drops above 2.5%: growing would waste more
    ],
)
def test_one_decision(target, figures, cap, expected, why):
    decision = decide(ROOMY, target, figures, cap)
    assert decision.target == expected, decision
    assert (why in decision.reason) if why else not decision.changed


def run(controller, figures, steps):
    return [controller.observe(figures, step).target for step in range(1, steps + 1)]


def test_warm_up_and_settling_hold_the_budget():
    controller = InflightController(ROOMY)
    dropping = StepFigures(1.0, 0.0, 16.0, 16.0)
    quiet_steps = WARMUP_STEPS + ROOMY.settle_steps - 1  # warm-up is ignored, then a full window is needed
    assert run(controller, dropping, quiet_steps) == [32] * quiet_steps
    assert controller.observe(dropping, quiet_steps + 1).target == 16
    assert [step for step, _, _ in controller.history] == [quiet_steps + 1]


def test_a_budget_that_dropped_is_not_reached_again_until_quiet_steps_passed():
    controller = InflightController(ROOMY)
    run(controller, StepFigures(1.0, 0.0, 16.0, 2.0), WARMUP_STEPS + ROOMY.settle_steps)  # 11% dropped at 32
    assert controller.target == 28 and controller.cap == 31
    waiting = StepFigures(1.0, 0.5, 16.0, 0.0)  # the trainer starves at 28 without drops: grow, but to 31 only
    assert max(run(controller, waiting, 3 * ROOMY.settle_steps)) == 31
    run(controller, StepFigures(1.0, 0.0, 16.0, 0.0), ROOMY.relax_steps)
    assert controller.cap == 32  # relaxed by one after relax_steps quiet steps: probing resumes slowly


def test_the_smoke_recipe_has_no_room_to_move():
    controller = InflightController(SMOKE)
    assert set(run(controller, StepFigures(1.0, 0.0, 16.0, 8.0), 20)) == {16}
    assert set(run(controller, StepFigures(2.0, 1.5, 16.0, 0.0), 20)) == {16}


def test_the_controller_settles_between_waste_and_starvation():
    """A toy pipeline: samples ahead above 24 go stale (a share growing with the excess), below 24 the trainer
    waits (a share growing with the shortfall). The budget must end near 24 and stay there, without oscillating."""

    def pipeline(ahead: int) -> StepFigures:
        dropped = max(0, ahead - 24) * 2.0
        wait = max(0, 24 - ahead) * 0.08
        return StepFigures(1.0 + wait, wait, 16.0, dropped)

    controller = InflightController(ROOMY)
    targets = []
    for step in range(1, 100):
        targets.append(controller.observe(pipeline(controller.target), step).target)
    assert all(23 <= t <= 25 for t in targets[-30:]), targets
    assert len(controller.history) <= 10, controller.history  # a few moves, not a limit cycle


def test_figures_come_from_trls_logs():
    logs = {
        "perf/step_s": 2.0,
        "perf/rollout_wait_s": 0.5,
        "batch/samples_per_step": 16.0,
        "sample/dropped_stale_total": 3.0,
        "rollout/duration_s": 0.7,
    }
    assert StepFigures.from_logs(logs) == StepFigures(2.0, 0.5, 16.0, 3.0, 0.7)
    assert StepFigures.from_logs({"perf/step_s": 1.0}) == StepFigures(1.0, 0.0, 0.0, 0.0, None)
    assert StepFigures.from_logs({"loss": 0.1}) is None  # the first step has no step time yet


def test_a_fed_trainer_is_one_the_fleet_can_release_on():
    """The wait the controller tolerates is the automatic fleet's release share (issue 42's open item): a budget held
    with the trainer waiting more would keep the fleet from ever releasing a replica."""
    assert MAX_WAIT_SHARE == FleetConfig().release_wait_share == 0.02
    assert ROOMY.max_wait_share == MAX_WAIT_SHARE < FleetConfig().add_wait_share
    below = Limits(samples_per_step=16, group_size=8, max_staleness=2, max_wait_share=0.01)
    assert decide(below, 20, window(wait_s=0.015), 32).changed  # a run's own, lower release share is honoured


def test_run_limits_carry_the_runs_release_share():
    from types import SimpleNamespace

    from agrpo.trainer.rollout.pacing import run_limits

    args = SimpleNamespace(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        num_generations=8,
        weight_sync_steps=1,
        max_staleness=2,
    )
    assert run_limits(args).max_wait_share == MAX_WAIT_SHARE
    limits = run_limits(args, num_processes=2, max_wait_share=0.01)
    assert (limits.samples_per_step, limits.max_wait_share) == (32, 0.01)
