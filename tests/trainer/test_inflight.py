"""The in-flight controller as a pure policy: limits, single decisions (a table), and whole runs of figures."""

import pytest

from agrpo.trainer.inflight import (
    InflightController,
    Limits,
    StepFigures,
    Window,
    decide,
    fixed_inflight,
    is_auto,
)

SMOKE = Limits(samples_per_step=16, group_size=8, weight_sync_steps=1, max_staleness=1)
ROOMY = Limits(samples_per_step=16, group_size=8, weight_sync_steps=1, max_staleness=2)  # ceiling 32


def test_limits_follow_the_staleness_bound():
    assert (SMOKE.floor, SMOKE.initial, SMOKE.ceiling, SMOKE.settle_steps) == (8, 16, 16, 3)
    blog = Limits(samples_per_step=64, group_size=8, weight_sync_steps=4, max_staleness=4)
    assert blog.initial == blog.ceiling == 64 * 4 * 4
    lock_step = Limits(samples_per_step=16, group_size=8, max_staleness=0)
    assert lock_step.ceiling == 16  # one version's worth
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
        # drops above 5%: shrink by the share dropped (at least one sample)
        (16, window(dropped=4.0), 32, 12, "dropped"),  # 12 of 60 = 20%: floor(16 x 0.8)
        (16, window(dropped=1.0), 32, 15, "dropped"),  # 5.9%: floor(16 x 0.94) = 15
        (16, window(dropped=16.0), 32, 8, "dropped"),  # 50%: halved
        (9, window(dropped=16.0), 32, 8, "dropped"),  # never below one group
        (8, window(dropped=16.0, wait_s=0.5), 32, 8, ""),  # at the floor: nothing left to shrink, hold
        # the trainer waits more than 10% with (almost) no drops: grow, by the wait at most x1.5
        (16, window(wait_s=0.2), 32, 20, "waited"),  # step 1.0 / busy 0.8 = x1.25
        (16, window(wait_s=0.6), 32, 24, "waited"),  # x2.5 capped at x1.5
        (16, window(wait_s=0.6), 18, 18, "waited"),  # capped by the learned cap
        (16, window(wait_s=0.6, rollout_s=0.4), 32, 20, "waited"),  # needed: 40 samples/s x 0.4 s x 1.25 = 20
        (31, window(wait_s=0.6), 32, 32, "waited"),  # the ceiling
        (32, window(wait_s=0.6), 32, 32, ""),  # at the cap: hold
        # the dead band: hold
        (16, window(wait_s=0.05), 32, 16, ""),  # 5% wait
        (16, window(dropped=0.6), 32, 16, ""),  # 3.6% dropped: under 5%
        (16, window(dropped=0.6, wait_s=0.5), 32, 16, ""),  # waits, but drops above 2.5%: growing would waste more
    ],
)
def test_one_decision(target, figures, cap, expected, why):
    decision = decide(ROOMY, target, figures, cap)
    assert decision.target == expected, decision
    assert (why in decision.reason) if why else not decision.changed


def run(controller, figures, steps):
    return [controller.observe(figures, step).target for step in range(1, steps + 1)]


def test_warm_up_and_settling_hold_the_budget():
    controller = InflightController(SMOKE)
    dropping = StepFigures(1.0, 0.0, 16.0, 16.0)
    # steps 1-2 are warm-up, then 3 steps of figures are needed before the first decision
    assert run(controller, dropping, 4) == [16, 16, 16, 16]
    assert controller.observe(dropping, 5).target == 8 and controller.history == [(5, 8, controller.history[0][2])]


def test_a_budget_that_dropped_is_not_reached_again_until_quiet_steps_passed():
    controller = InflightController(SMOKE)
    run(controller, StepFigures(1.0, 0.0, 16.0, 2.0), 5)  # 11% dropped at 16
    assert controller.target == 14 and controller.cap == 15
    waiting = StepFigures(1.0, 0.5, 16.0, 0.0)  # the trainer starves at 14 without drops: grow, but to 15 only
    targets = run(controller, waiting, 3 * SMOKE.settle_steps)
    assert max(targets) == 15
    quiet = StepFigures(1.0, 0.0, 16.0, 0.0)
    run(controller, quiet, SMOKE.relax_steps)
    assert controller.cap == 16  # relaxed by one after relax_steps quiet steps: probing resumes slowly


def test_the_controller_settles_between_waste_and_starvation():
    """A toy pipeline: samples ahead above 12 go stale (a share growing with the excess), below 12 the trainer
    waits (a share growing with the shortfall). The budget must end near 12 and stay there, without oscillating."""

    def pipeline(ahead: int) -> StepFigures:
        dropped = max(0, ahead - 12) * 2.0
        wait = max(0, 12 - ahead) * 0.08
        return StepFigures(1.0 + wait, wait, 16.0, dropped)

    controller = InflightController(SMOKE)
    targets = []
    for step in range(1, 80):
        targets.append(controller.observe(pipeline(controller.target), step).target)
    assert all(11 <= t <= 13 for t in targets[-30:]), targets
    assert len(controller.history) <= 8, controller.history  # a few moves, not a limit cycle


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
