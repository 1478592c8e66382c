"""The fleet policy as a table: signals and memory in, decision out (no processes, no sockets)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agrpo.fleet.policy import ADD, HOLD, RELEASE, Change, Decision, Knobs, Memory, Signals, decide, took_effect

K = Knobs(
    min_replicas=1,
    max_replicas=3,
    window_steps=5,
    cooldown_s=30,
    backoff_s=300,
    add_wait_share=0.25,
    release_wait_share=0.05,
)


def sig(**kw) -> Signals:
    base = dict(now=1000.0, replicas=1, steps=5, steps_per_s=1.0, wait_share=0.1)
    return Signals(**{**base, **kw})


@pytest.mark.parametrize(
    "signals, memory, action, words",
    [
        (sig(wait_share=0.6), Memory(), ADD, "generation-bound"),
        (sig(wait_share=0.6, replicas=3), Memory(), HOLD, "balanced"),  # at max_replicas
        (sig(wait_share=0.4, steps=3), Memory(), HOLD, "3 of 5 steps"),
        # starved (>= starved_wait_share, 0.5): added after starved_steps (2), not window_steps
        (sig(wait_share=0.8, steps=2), Memory(), ADD, "starved after 2 steps: generation-bound"),
        (sig(wait_share=0.8, steps=1), Memory(), HOLD, "1 of 5 steps"),  # one step decides nothing
        (sig(wait_share=0.8, steps=2, stale_share=0.3), Memory(), HOLD, "2 of 5 steps"),  # an add's own rules hold
        (sig(wait_share=0.8, steps=2, replicas=3), Memory(), HOLD, "2 of 5 steps"),  # at max_replicas
        # the last change waits for its window to be judged, or is cooling down: no early add
        (sig(wait_share=0.8, steps=2), Memory(last=Change(ADD, 990.0, 1.0, 0.6), judged=False), HOLD, "2 of 5"),
        (sig(wait_share=0.8, steps=2), Memory(last=Change(ADD, 990.0, 1.0, 0.6), judged=True), HOLD, "2 of 5"),
        (sig(wait_share=0.8, steps=2), Memory(last=Change(ADD, 900.0, 1.0, 0.6), judged=True), ADD, "starved"),
        (sig(wait_share=0.6, changing=True), Memory(), HOLD, "under way"),
        (sig(wait_share=0.6, stale_share=0.3), Memory(), HOLD, "stale"),
        (sig(wait_share=0.6), Memory(no_add_until=1200.0), HOLD, "did not help lately"),
        # the in-flight budget can still grow and the replicas are not busy: grow it first
        (sig(wait_share=0.6, inflight_target=8, inflight_ceiling=32, busy_share=0.0), Memory(), HOLD, "budget"),
        (sig(wait_share=0.6, inflight_target=8, inflight_ceiling=32, busy_share=1.0), Memory(), ADD, "bound"),
        (sig(wait_share=0.6, inflight_target=32, inflight_ceiling=32), Memory(), ADD, "bound"),
        # below its ceiling but no longer rising (its controller backed off after stale drops): it will not feed
        # the trainer, so add (seen: held at 22 of 48 for 80 steps while the trainer waited 90% of each step)
        (sig(wait_share=0.6, inflight_target=22, inflight_ceiling=48, inflight_rising=False), Memory(), ADD, "bound"),
        # stale drops while the budget's controller cuts for them (benchmarks/elastic.py, straggler: 16% dropped in
        # the first 20 steps from rollouts slower than a version, which held the addition back to step 26 of 100)
        (
            sig(wait_share=0.8, stale_share=0.16, inflight_target=19, inflight_ceiling=48, inflight_cut=True),
            Memory(),
            ADD,
            "bound",
        ),
        # a cut budget climbs back one sample at a time: a rise since does not hold the addition back either
        (
            sig(wait_share=0.8, inflight_target=20, inflight_ceiling=48, inflight_rising=True, inflight_cut=True),
            Memory(),
            ADD,
            "bound",
        ),
        # hysteresis: between the two shares nothing moves, in either direction
        (sig(wait_share=0.15, replicas=2), Memory(), HOLD, "balanced"),
        (sig(wait_share=0.02, replicas=2), Memory(), RELEASE, "idle"),
        (sig(wait_share=0.02, replicas=1), Memory(), HOLD, "balanced"),  # at min_replicas
        (sig(wait_share=0.02, replicas=2), Memory(no_release_until=1100.0), HOLD, "balanced"),
        # idle, but the one replica left would be busy 2 x 0.6 of the time: no room to release into
        (sig(wait_share=0.02, replicas=2, busy_share=0.6), Memory(), HOLD, "balanced"),
        (sig(wait_share=0.02, replicas=3, busy_share=0.5), Memory(), RELEASE, "idle"),  # 3 x 0.5 / 2 = 0.75 <= 0.8
        (sig(replicas=0), Memory(), ADD, "below inference.min_replicas"),
        (sig(replicas=4), Memory(), RELEASE, "above inference.max_replicas"),
    ],
)
def test_decisions(signals, memory, action, words):
    decision, _ = decide(signals, memory, K)
    assert decision.action == action
    assert words in decision.reason


def judged(last: Change, after: Signals) -> tuple[Decision, Memory]:
    return decide(after, Memory(last=last, judged=False), K)


def test_an_addition_that_helped_is_kept_and_said_once():
    decision, memory = judged(Change(ADD, 900.0, 1.0, 0.6), sig(now=960.0, replicas=2, steps_per_s=1.3, wait_share=0.3))
    assert (decision.action, decision.verdict) == (HOLD, "kept")
    assert "1.00 -> 1.30" in decision.reason
    assert memory.judged and memory.no_add_until == 0.0
    again, _ = decide(sig(now=961.0, replicas=2, steps_per_s=1.3, wait_share=0.3), memory, K)
    assert again.verdict == ""


def test_an_addition_that_cut_the_wait_but_not_the_step_time_is_undone():
    """What 2 cores showed: the newcomer on the trainer's core cut its wait 71% -> 46% of each step by slowing the
    trainer, at the same steps/s. The wait alone keeps nothing."""
    decision, _ = judged(Change(ADD, 900.0, 0.49, 0.71), sig(now=960.0, replicas=2, steps_per_s=0.50, wait_share=0.46))
    assert (decision.action, decision.undo) == (RELEASE, True)


def test_an_addition_that_only_took_the_trainers_cores_is_undone_and_not_tried_again():
    before = Change(ADD, 900.0, 1.0, 0.6)
    decision, memory = judged(before, sig(now=960.0, replicas=2, steps_per_s=0.9, wait_share=0.6))
    assert (decision.action, decision.undo) == (RELEASE, True)
    assert "did not help" in decision.reason and memory.no_add_until == 960.0 + 300
    memory = took_effect(decision, sig(now=960.0, replicas=2), 970.0, memory)
    assert memory.judged  # an undo is never judged in turn
    later, _ = decide(sig(now=1100.0, replicas=1, wait_share=0.6), memory, K)
    assert later.action == HOLD and "did not help lately" in later.reason
    much_later, _ = decide(sig(now=1300.0, replicas=1, wait_share=0.6), memory, K)
    assert much_later.action == ADD


def test_a_release_that_slowed_training_is_undone():
    slowed = sig(now=960.0, replicas=1, steps_per_s=0.7, wait_share=0.4)  # the trainer waits for rollouts again
    decision, memory = judged(Change(RELEASE, 900.0, 1.0, 0.02), slowed)
    assert (decision.action, decision.undo) == (ADD, True)
    assert memory.no_release_until == 960.0 + 300


def test_a_release_after_which_the_trainer_still_hardly_waits_is_kept_even_if_steps_slowed():
    """tests/e2e/test_elastic.py: a trainer-bound run's 5-step steps/s fell 2.38 -> 1.75 after a release while the
    trainer waited 0% -> 2% of each step: its own steps varied, the fleet did not slow it."""
    slower = sig(now=960.0, replicas=1, steps_per_s=0.7, wait_share=0.02)
    decision, _ = judged(Change(RELEASE, 900.0, 1.0, 0.0), slower)
    assert decision.verdict == "kept" and "kept the release" in decision.reason


def test_a_release_after_which_the_trainer_waits_again_is_undone_even_at_the_same_pace():
    """benchmarks/elastic.py --long on 2 cores: one replica fewer left the trainer more cores, so steps/s rose 0.69 ->
    0.74 while it waited 0% -> 40% of each step; kept, the release was followed by an addition and a 38 s boot."""
    faster = sig(now=960.0, replicas=1, steps_per_s=1.07, wait_share=0.4)
    decision, memory = judged(Change(RELEASE, 900.0, 1.0, 0.0), faster)
    assert (decision.action, decision.undo) == (ADD, True) and "undo the release" in decision.reason
    assert memory.no_release_until == 960.0 + 300


def test_a_release_that_kept_the_pace_is_kept():
    decision, _ = judged(Change(RELEASE, 900.0, 1.0, 0.02), sig(now=960.0, replicas=1, steps_per_s=0.98))
    assert decision.verdict == "kept"


def test_cool_down_after_a_kept_change():
    memory = Memory(last=Change(ADD, 990.0, 1.0, 0.6), judged=True)
    decision, _ = decide(sig(now=1000.0, replicas=2, wait_share=0.6), memory, K)
    assert decision.action == HOLD and "cooling down" in decision.reason
    decision, _ = decide(sig(now=1021.0, replicas=2, wait_share=0.6), memory, K)
    assert decision.action == ADD


def test_took_effect_keeps_the_window_it_was_decided_on_as_baseline():
    decision = Decision(ADD, "x")
    memory = took_effect(decision, sig(steps_per_s=0.8, wait_share=0.7), 1234.0, Memory())
    assert memory.last == Change(ADD, 1234.0, 0.8, 0.7) and not memory.judged


def test_each_further_undo_of_a_kind_doubles_its_backoff():
    """benchmarks/fleet_simulation.py: a fleet just big enough keeps trying a release that slows it; each undo waits
    twice as long as the last before the next try (300, 600, 1200 s), and the other kind's backoff is untouched."""
    memory = Memory(undone=(0, 2))
    memory = replace(memory, last=Change(RELEASE, 900.0, steps_per_s=1 / 30, wait_share=0.0), judged=False)
    decision, memory = decide(sig(steps_per_s=1 / 40, wait_share=0.25, replicas=1), memory, K)
    assert (decision.action, decision.undo) == (ADD, True) and "no release for 1200 s" in decision.reason
    assert memory.undone == (0, 3) and memory.no_release_until == 1000.0 + 1200
