"""Read TRL's pipeline metrics the way one reads the dashboard: which side of the async pipeline is slow, and which
knob to turn. Pure: takes the logged metric dicts, returns a verdict and a one-line explanation.

- generation-bound: the trainer waits for rollouts (`perf/rollout_wait_s` is a large share of `perf/step_s`), so
  more generation capacity helps: replicas, requests in flight, a looser staleness bound.
- trainer-bound: rollouts pile up (the queue is full and the generator is back-pressured, or samples go stale before
  the trainer reaches them), so faster steps help: packed token budget, no gradient checkpointing, more trainer GPUs,
  or fewer requests in flight to stop wasting generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

WAIT_SHARE_GENERATION_BOUND = 0.25  # trainer idle for a quarter of each step or more
SYNC_SHARE_WORTH_MENTIONING = 0.2

GENERATION_KNOBS = "add replicas (inference.replicas) or requests in flight (trainer.max_inflight_tasks)"
SYNC_KNOB = "sync less often (trainer.weight_sync_steps)"
TRAINER_KNOBS = ("speed up steps: packed batches (trainer.token_budget), trainer.gradient_checkpointing=false if "
                 "memory allows, more trainer GPUs; or lower trainer.max_inflight_tasks to stop generating samples "
                 "that go stale")


@dataclass(frozen=True)
class Verdict:
    kind: str  # "generation-bound" | "trainer-bound" | "balanced"
    line: str


def _mean(window: list[dict[str, Any]], key: str) -> float | None:
    values = [float(entry[key]) for entry in window if key in entry]
    return fmean(values) if values else None


def diagnose(window: list[dict[str, Any]]) -> Verdict | None:
    """Verdict over a window of per-step log dicts (TRL's `logs`); None when there is no timing yet."""
    step = _mean(window, "perf/step_s")
    if not step:
        return None
    wait = _mean(window, "perf/rollout_wait_s") or 0.0
    sync = _mean(window, "perf/weight_sync_s") or 0.0
    backpressure = _mean(window, "rollout/backpressure_s") or 0.0
    stale = [float(e["sample/dropped_stale_total"]) for e in window if "sample/dropped_stale_total" in e]
    queue = _mean(window, "sample/rollout_queue_size") or 0.0
    wait_share, sync_share = wait / step, sync / step
    facts = (f"step {step:.2f} s, trainer waited {wait_share:.0%} of it for rollouts, weight sync {sync_share:.0%}, "
             f"rollout queue {queue:.0f}")
    if wait_share >= WAIT_SHARE_GENERATION_BOUND:
        knobs = GENERATION_KNOBS + (f"; {SYNC_KNOB}" if sync_share >= SYNC_SHARE_WORTH_MENTIONING else "")
        return Verdict("generation-bound", f"generation-bound ({facts}): {knobs}")
    if backpressure > 0 or (stale and max(stale) > 0):
        detail = f"{facts}, generator back-pressured {backpressure:.2f} s" + (
            f", {max(stale):.0f} stale samples dropped" if stale and max(stale) > 0 else "")
        return Verdict("trainer-bound", f"trainer-bound ({detail}): {TRAINER_KNOBS}")
    return Verdict("balanced", f"balanced ({facts}): generation and training keep pace")
