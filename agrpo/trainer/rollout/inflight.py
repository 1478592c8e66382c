"""How many rollout samples may be ahead of the trainer: a pure policy (`trainer.max_inflight_tasks=auto`).

"Ahead" is every rollout the generator has started and the trainer has not taken yet: requests in flight, finished
rollouts waiting for their group, scored samples in the queue. The budget bounds that number, so it sizes requests
in flight and the queue at once (a fixed number of requests in flight, as TRL has, lets the queue fill with samples
that go stale: 52-87% of them were thrown away on this machine).

Why that quantity: samples are trained in about the order they finish, and the trainer takes `samples_per_step` of
them per step. A sample started while v(N-1) is served must be trained before the trainer publishes
v(N-1+max_staleness+1), i.e. within the next `samples_per_step x weight_sync_steps x max_staleness` samples it takes:
more samples ahead than that are thrown away (the ceiling below). And the trainer never waits for rollouts when
`ahead >= consumption rate x time a rollout takes`: the estimate used when it grows.

The controller is pure (figures in, budget out) and table-tested; agrpo/trainer/rollout/pacing.py measures and
applies it. Hysteresis: a decision needs `settle_steps` steps of figures taken after the last change (samples started
under the old budget are trained or dropped by then), a dead band between the drop and wait thresholds holds the
budget, and a budget that dropped too much is not reached again until `relax_steps` quiet steps have passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agrpo.config.schema.inference import FleetConfig
from agrpo.config.schema.trainer import staleness_ceiling

MAX_DROP_SHARE = 0.05  # at most 5% of generated samples thrown away as stale ...
# ... while the trainer waits for rollouts less than the share of a step at which an automatic fleet releases a
# replica (inference.fleet.release_wait_share): a trainer this controller considers fed is one the fleet can release
# on. It was 10%, and a budget cut to one batch by a straggler's stale drops left the trainer waiting 6-12% of every
# step, "fed" here and "still waiting" for the fleet, which then never released (docs/elastic.md, "Resolved conflict").
MAX_WAIT_SHARE = FleetConfig().release_wait_share
GROWTH_CAP = 1.5  # one decision raises the budget by at most half
LATENCY_MARGIN = 1.25  # a group is trainable when its slowest rollout is done: more than the mean rollout time
WARMUP_STEPS = 5  # the first steps warm the server (first requests with logprobs, first adapters): not the steady state


@dataclass(frozen=True)
class Limits:
    """What the run's shape allows: the budget's floor, ceiling and starting value."""

    samples_per_step: int
    group_size: int
    weight_sync_steps: int = 1
    max_staleness: int = 1
    max_drop_share: float = MAX_DROP_SHARE
    max_wait_share: float = MAX_WAIT_SHARE

    @property
    def ceiling(self) -> int:
        """The staleness bound (the schema's rule, which resolve also sizes TRL's requests in flight with)."""
        return staleness_ceiling(self.samples_per_step, self.group_size, self.weight_sync_steps, self.max_staleness)

    @property
    def floor(self) -> int:
        """One step's worth (and one group at least): the trainer takes that many at once, so with fewer ahead each
        batch is generated in pieces, one after the other, and the trainer waits for every piece."""
        return min(max(self.group_size, self.samples_per_step), self.ceiling)

    @property
    def initial(self) -> int:
        """TRL's own automatic value (max_staleness x samples per step): the controller shrinks from there when
        samples still go stale (rollouts slower than a version lasts) and grows when the trainer waits."""
        return self.clamp(self.samples_per_step * max(self.max_staleness, 1))

    @property
    def settle_steps(self) -> int:
        """Steps after a change before its effect shows: samples started under the old budget are gone by then."""
        return self.max_staleness * self.weight_sync_steps + 2

    @property
    def relax_steps(self) -> int:
        return 3 * self.settle_steps

    def clamp(self, value: float) -> int:
        return int(min(max(value, self.floor), self.ceiling))


@dataclass(frozen=True)
class StepFigures:
    """One optimizer step, as TRL logged it."""

    step_s: float
    wait_s: float  # the trainer waited this long for rollouts
    used: float  # samples trained
    dropped: float  # samples dropped as stale
    rollout_s: float | None = None  # mean time from a rollout's dispatch to its completion

    @classmethod
    def from_logs(cls, logs: Mapping[str, Any]) -> StepFigures | None:
        step = logs.get("perf/step_s")
        if step is None or not step > 0:
            return None
        rollout = logs.get("rollout/duration_s")
        return cls(
            step_s=float(step),
            wait_s=float(logs.get("perf/rollout_wait_s") or 0.0),
            used=float(logs.get("batch/samples_per_step") or 0.0),
            dropped=float(logs.get("sample/dropped_stale_total") or 0.0),
            rollout_s=float(rollout) if rollout else None,
        )


@dataclass(frozen=True)
class Window:
    """Figures summed over the steps a decision looks at."""

    steps: int
    step_s: float
    wait_s: float
    used: float
    dropped: float
    rollout_s: float | None

    @classmethod
    def of(cls, figures: Sequence[StepFigures]) -> Window:
        latencies = [f.rollout_s for f in figures if f.rollout_s]
        return cls(
            steps=len(figures),
            step_s=sum(f.step_s for f in figures),
            wait_s=sum(f.wait_s for f in figures),
            used=sum(f.used for f in figures),
            dropped=sum(f.dropped for f in figures),
            rollout_s=sum(latencies) / len(latencies) if latencies else None,
        )

    @property
    def drop_share(self) -> float:
        total = self.used + self.dropped
        return self.dropped / total if total else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.step_s if self.step_s else 0.0

    def needed_ahead(self) -> float | None:
        """Samples ahead that keep the trainer fed: its consumption rate when not waiting x a rollout's time."""
        busy = self.step_s - self.wait_s
        if self.rollout_s is None or busy <= 0 or self.used <= 0:
            return None
        return self.used / busy * self.rollout_s * LATENCY_MARGIN


@dataclass(frozen=True)
class Decision:
    target: int
    reason: str = ""  # empty when the budget is held

    @property
    def changed(self) -> bool:
        return bool(self.reason)


def decide(limits: Limits, target: int, window: Window, cap: int) -> Decision:
    """The budget after `window` (figures since the last change). `cap` is the highest budget allowed now (the
    ceiling, lowered below a budget that dropped too much)."""
    drop, wait = window.drop_share, window.wait_share
    if drop > limits.max_drop_share and target > limits.floor:
        shrunk = limits.clamp(min(target - 1, math.floor(target * (1.0 - drop))))
        return Decision(shrunk, f"{drop:.0%} of samples dropped as stale (> {limits.max_drop_share:.0%})")
    if wait > limits.max_wait_share and drop <= limits.max_drop_share / 2 and target < cap:
        grown = math.ceil(target * min(GROWTH_CAP, window.step_s / max(window.step_s - window.wait_s, 1e-9)))
        needed = window.needed_ahead()
        if needed is not None:
            grown = min(grown, math.ceil(needed))  # no further than what keeps the trainer fed
        grown = min(max(grown, target + 1), cap, limits.ceiling)
        return Decision(grown, f"trainer waited {wait:.0%} of its steps for rollouts (> {limits.max_wait_share:.0%})")
    return Decision(target)


@dataclass
class InflightController:
    """The budget over a run: feed it each step's figures, read `target`."""

    limits: Limits
    target: int = 0
    cap: int = 0
    history: list[tuple[int, int, str]] = field(default_factory=list)  # (step, new target, reason)
    _figures: list[StepFigures] = field(default_factory=list)
    _seen: int = 0
    _quiet: int = 0  # held steps since the cap was last lowered or raised

    def __post_init__(self) -> None:
        self.target = self.target or self.limits.initial
        self.cap = self.cap or self.limits.ceiling

    def observe(self, figures: StepFigures | None, step: int = 0) -> Decision:
        self._seen += 1
        if figures is None or self._seen <= WARMUP_STEPS:
            return Decision(self.target)
        self._figures.append(figures)
        self._figures = self._figures[-2 * self.limits.settle_steps :]  # a sliding window while the budget holds
        if len(self._figures) < self.limits.settle_steps:
            return Decision(self.target)
        decision = decide(self.limits, self.target, Window.of(self._figures), self.cap)
        if decision.target < self.target:
            self.cap = max(self.limits.floor, self.target - 1)  # do not climb straight back to what dropped
            self._quiet = 0
        elif not decision.changed:
            self._quiet += 1
            if self._quiet >= self.limits.relax_steps and self.cap < self.limits.ceiling:
                self.cap += 1  # conditions change (longer completions, a faster replica): probe again, slowly
                self._quiet = 0
        if decision.changed and decision.target != self.target:
            self.target = decision.target
            self._figures = []
            self.history.append((step, decision.target, decision.reason))
            return decision
        return Decision(self.target)
