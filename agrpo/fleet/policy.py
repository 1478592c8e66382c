"""When to add or release a replica: a pure function of the run's measured signals and the policy's memory.

Add when generation is the bottleneck: the trainer waits for rollouts a large share of each step
(`add_wait_share`), few samples are thrown away as stale (more generation would raise that waste) unless the in-flight
budget's controller is already cutting for them, and the in-flight budget cannot simply grow instead (it is at its
ceiling, was cut, stopped rising, or the replicas are already busy). Release when the trainer
hardly waits (`release_wait_share`; the gap between the two shares is the hysteresis). One change at a time, none
while one is under way, and none within `cooldown_s` of the last. A starved trainer (`starved_wait_share` of its first
`starved_steps` steps) gets its addition without waiting for a full window.

Each change is checked once `window_steps` steps ran after it took effect, against the `window_steps` steps before
it took effect: an added replica must have raised steps/s by `min_gain`, a release must not have cut steps/s by more
than that. A change that failed
is undone, and the same change is not tried again for `backoff_s`, twice as long after each further undo of its kind
(a release undone three times waits 4 x backoff_s): on a machine where another replica only takes the trainer's
cores, the policy learns not to add, and a fleet that is just big enough stops probing a release that slows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agrpo.config.schema.inference import FleetConfig

ADD, RELEASE, HOLD = "add", "release", "hold"
_SCHEMA = FleetConfig()


@dataclass(frozen=True)
class Knobs:
    """inference.fleet.* and the range; the defaults are the schema's (FleetConfig), never restated here."""

    min_replicas: int = 1
    max_replicas: int = 2
    window_steps: int = _SCHEMA.window_steps
    recent_steps: int = _SCHEMA.recent_steps
    cooldown_s: float = _SCHEMA.cooldown_s
    add_wait_share: float = _SCHEMA.add_wait_share
    starved_wait_share: float = _SCHEMA.starved_wait_share
    starved_steps: int = _SCHEMA.starved_steps
    release_wait_share: float = _SCHEMA.release_wait_share
    max_stale_share: float = _SCHEMA.max_stale_share
    min_gain: float = _SCHEMA.min_gain
    backoff_s: float = _SCHEMA.backoff_s


@dataclass(frozen=True)
class Signals:
    """What the run measured over the window: the latest `recent_steps` of the steps since the last change took effect
    (signals.py)."""

    now: float  # seconds, monotonic
    replicas: int  # serving now
    steps: int  # steps in the window
    steps_per_s: float | None = None
    wait_share: float | None = None  # the trainer's wait for rollouts / its step time
    stale_share: float | None = None  # dropped as stale / (dropped + trained)
    inflight_target: float | None = None  # the in-flight budget (trainer.max_inflight_tasks=auto), None when fixed
    inflight_ceiling: float | None = None  # what the staleness bound allows
    inflight_rising: bool = True  # the budget rose lately (signals.py: its last BUDGET_LOOKBACK steps), or too few
    # steps to tell: a budget below its ceiling that stopped rising (its controller backed off after stale drops)
    # will not feed the trainer, so it does not hold an addition back
    inflight_cut: bool = False  # the budget was lowered lately (signals.py): its controller is answering stale drops
    # by holding fewer samples ahead, so those drops say the rollouts are slower than a version lasts (which more
    # replicas shorten), not that there is too much generation; and the budget will not grow back to feed the trainer
    busy_share: float | None = None  # share of the replicas with a request waiting in their queue or their KV cache
    # over half full (the proxy's and vLLM's figures), averaged over the window's polls; None when unknown
    changing: bool = False  # a replica is starting or draining


@dataclass(frozen=True)
class Change:
    """The last change, kept until it is judged."""

    action: str  # ADD | RELEASE
    at: float  # when it took effect
    steps_per_s: float | None  # the window before it
    wait_share: float | None
    undo: bool = False  # it was itself the undoing of a change (never undone in turn)


@dataclass(frozen=True)
class Memory:
    last: Change | None = None  # the last change that took effect
    judged: bool = True  # whether `last` was judged already
    no_add_until: float = 0.0
    no_release_until: float = 0.0
    undone: tuple[int, int] = (0, 0)  # how many adds, releases were undone so far: each backoff is twice the last


@dataclass(frozen=True)
class Decision:
    action: str  # ADD | RELEASE | HOLD
    reason: str
    undo: bool = False  # undoes the last change
    verdict: str = ""  # "kept": the last change was judged and kept (worth a console line)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def judge(change: Change, now: Signals, knobs: Knobs) -> bool:
    """Whether `change` helped (an addition: steps/s rose by min_gain) or did no harm (a release: the trainer still
    waits less than add_wait_share of each step; steps/s when its wait is unknown), from the window after it. The
    trainer's wait alone does not keep an addition: a replica that takes the trainer's cores cuts the wait by
    slowing the trainer (measured: 71% -> 46% of each step at the same steps/s on 2 cores, docs/elastic.md). A
    release can only slow training by making the trainer wait for rollouts, so steps/s alone does not undo it: a
    trainer-bound run's step times vary by more than min_gain on their own (tests/e2e/test_elastic.py: 2.38 -> 1.75
    steps/s over 5 steps while the trainer waited 0% -> 2% of each, and the undo cost a vLLM boot)."""
    before, after = change.steps_per_s, now.steps_per_s
    if change.action == RELEASE and now.wait_share is not None:
        # kept while the trainer still waits less than add_wait_share; past it, whatever steps/s did, keeping the
        # release would only be followed by an addition, a boot, once the cool-down ends (benchmarks/elastic.py
        # --long: kept at steps/s 0.69 -> 0.74 while the wait rose 0% -> 40%, then added back with a 38 s boot)
        return now.wait_share < knobs.add_wait_share
    if before is None or after is None:
        return True  # nothing to compare: keep it
    if change.action == ADD:
        return after >= before * (1 + knobs.min_gain)
    return after >= before * (1 - knobs.min_gain)


def check_last(signals: Signals, memory: Memory, knobs: Knobs) -> tuple[Decision, Memory] | None:
    """Judge the last change once its window is full; undo it if it did not help. None: nothing to judge."""
    last = memory.last
    if last is None or memory.judged or last.undo:
        return None
    figures = (
        f"steps/s {_rate(last.steps_per_s)} -> {_rate(signals.steps_per_s)}, trainer waited "
        f"{_pct(last.wait_share)} -> {_pct(signals.wait_share)} of each step"
    )
    if judge(last, signals, knobs):
        return Decision(HOLD, f"kept the {last.action}: {figures}", verdict="kept"), replace(memory, judged=True)
    adds, releases = memory.undone
    if last.action == ADD:
        backoff = knobs.backoff_s * 2**adds
        memory = replace(memory, judged=True, no_add_until=signals.now + backoff, undone=(adds + 1, releases))
        reason = f"undo the add, it did not help ({figures}); no add for {backoff:g} s"
        return Decision(RELEASE, reason, undo=True), memory
    backoff = knobs.backoff_s * 2**releases
    memory = replace(memory, judged=True, no_release_until=signals.now + backoff, undone=(adds, releases + 1))
    reason = f"undo the release, the trainer waits for rollouts again ({figures}); no release for {backoff:g} s"
    return Decision(ADD, reason, undo=True), memory


def bounds_decision(signals: Signals, knobs: Knobs) -> Decision | None:
    """Below min_replicas (a replica was lost) or above max_replicas: back into the range, before any signal."""
    if signals.replicas < knobs.min_replicas:
        return Decision(
            ADD, f"{signals.replicas} replica(s) serving, below inference.min_replicas={knobs.min_replicas}"
        )
    if signals.replicas > knobs.max_replicas:
        return Decision(RELEASE, f"{signals.replicas} replicas, above inference.max_replicas={knobs.max_replicas}")
    return None


def replacement(serving: int, knobs: Knobs, replaced: int, max_replacements: int) -> Decision | None:
    """After a replica was lost for good (a replica Job preempted or failed: nothing restarts it), replace it while
    the fleet is below min_replicas and the run's replacements are not spent. None: the fleet is within its range,
    so the signals decide (a lost replica above min_replicas is not replaced for its own sake)."""
    if serving >= knobs.min_replicas:
        return None
    below = f"{serving} replica(s) serving, below inference.min_replicas={knobs.min_replicas}"
    if replaced >= max_replacements:
        return Decision(
            HOLD,
            f"{below}, but {replaced} lost replica(s) were replaced already (inference.fleet.max_replacements="
            f"{max_replacements}): going on with {serving}",
        )
    return Decision(ADD, f"replace a lost replica: {below} (replacement {replaced + 1} of {max_replacements})")


def wants_add(signals: Signals, memory: Memory, knobs: Knobs) -> Decision | None:
    wait = signals.wait_share
    if wait is None or wait < knobs.add_wait_share or signals.replicas >= knobs.max_replicas:
        return None
    if signals.now < memory.no_add_until:
        return Decision(
            HOLD,
            f"generation-bound, but an added replica did not help lately: no add for "
            f"{memory.no_add_until - signals.now:.0f} s",
        )
    stale = signals.stale_share is not None and signals.stale_share > knobs.max_stale_share
    if stale and not signals.inflight_cut:
        return Decision(
            HOLD,
            f"generation-bound, but {_pct(signals.stale_share)} of the samples go stale: more "
            "generation would raise that waste",
        )
    budget_room = (
        signals.inflight_target is not None
        and signals.inflight_ceiling is not None
        and signals.inflight_target < signals.inflight_ceiling
        and signals.inflight_rising
        and not signals.inflight_cut
    )
    if budget_room and not (signals.busy_share or 0.0) >= 0.5:
        return Decision(HOLD, "generation-bound, but the in-flight budget can still grow on the replicas there are")
    return Decision(
        ADD,
        f"generation-bound: the trainer waited {_pct(wait)} of each step for rollouts "
        f"(>= inference.fleet.add_wait_share={knobs.add_wait_share:g}) at {_rate(signals.steps_per_s)} steps/s",
    )


# A release must leave the remaining replicas this much below saturation: with R replicas busy a share b of the time,
# R - 1 would be busy b x R / (R - 1) of it (benchmarks/fleet_simulation.py: without it a fleet just big enough kept
# releasing a replica the trainer then waited for, and undoing that).
RELEASE_HEADROOM = 0.8


def leaves_room(signals: Signals) -> bool:
    """Whether one replica fewer would still keep up (unknown load: assume it would)."""
    if signals.busy_share is None or signals.replicas <= 1:
        return True
    return signals.busy_share * signals.replicas / (signals.replicas - 1) <= RELEASE_HEADROOM


def wants_release(signals: Signals, memory: Memory, knobs: Knobs) -> Decision | None:
    wait = signals.wait_share
    if wait is None or wait > knobs.release_wait_share or signals.replicas <= knobs.min_replicas:
        return None
    if signals.now < memory.no_release_until or not leaves_room(signals):
        return None
    return Decision(
        RELEASE,
        f"replicas idle: the trainer waited only {_pct(wait)} of each step for rollouts "
        f"(<= inference.fleet.release_wait_share={knobs.release_wait_share:g})",
    )


def starved_add(signals: Signals, memory: Memory, knobs: Knobs) -> Decision | None:
    """An addition before `window_steps` steps were measured, when the trainer waited at least `starved_wait_share`
    of its first `starved_steps` steps: a window would only confirm it while the newcomer could already be booting. Not
    while the last change waits to be judged (that needs its window) or within its cool-down; the rules of an
    ordinary addition (stale drops, a budget that can still grow) still apply."""
    wait = signals.wait_share
    if signals.steps < knobs.starved_steps or wait is None or wait < knobs.starved_wait_share:
        return None
    last = memory.last
    if last is not None and (not (memory.judged or last.undo) or signals.now - last.at < knobs.cooldown_s):
        return None
    decision = wants_add(signals, memory, knobs)
    if decision is None or decision.action != ADD:
        return None
    return replace(decision, reason=f"starved after {signals.steps} steps: {decision.reason}")


def decide(signals: Signals, memory: Memory, knobs: Knobs) -> tuple[Decision, Memory]:
    """The next step for the fleet, and the policy's memory after it. A returned ADD or RELEASE is carried out by
    the caller, which reports it back with `took_effect` once the replica serves (or has stopped)."""
    if signals.changing:
        return Decision(HOLD, "a change is under way"), memory
    bounds = bounds_decision(signals, knobs)
    if bounds is not None:
        return bounds, memory
    if signals.steps < knobs.window_steps:
        early = starved_add(signals, memory, knobs)
        return early or Decision(HOLD, f"{signals.steps} of {knobs.window_steps} steps measured"), memory
    checked = check_last(signals, memory, knobs)
    if checked is not None:  # kept (one line, the next poll may change again) or undone
        return checked
    if memory.last is not None and signals.now - memory.last.at < knobs.cooldown_s:
        return Decision(HOLD, "cooling down after the last change"), memory
    decision = wants_add(signals, memory, knobs) or wants_release(signals, memory, knobs)
    return decision or Decision(HOLD, "balanced"), memory


def took_effect(decision: Decision, before: Signals, now: float, memory: Memory) -> Memory:
    """The policy's memory once `decision` took effect at `now`; `before` is the window it was decided on (its
    baseline when the change is judged)."""
    change = Change(decision.action, now, before.steps_per_s, before.wait_share, undo=decision.undo)
    return replace(memory, last=change, judged=decision.undo)
