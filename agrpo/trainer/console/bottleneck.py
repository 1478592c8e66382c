"""Read TRL's pipeline metrics the way one reads the dashboard: which side of the async pipeline is slow, how much
generation is thrown away, and which knob to turn. Pure: takes the logged metric dicts, returns a verdict and a
one-line explanation.

- generation-bound: the trainer waits for rollouts (`perf/rollout_wait_s` is a large share of `perf/step_s`), so
  more generation capacity helps: replicas, requests in flight, a looser staleness bound.
- trainer-bound: rollouts pile up (the queue is full and the generator is back-pressured), so faster steps help:
  packed token budget, no gradient checkpointing, more trainer GPUs.
- stale waste (either side): TRL drops a sample whose policy version lags more than `max_staleness` behind and counts
  it in `sample/dropped_stale_total` (a counter: the sum over the logging window). The share dropped is
  dropped / (dropped + trained), trained being `batch/samples_per_step`. When it is large, more requests in flight
  would only raise the waste: the knob is fewer requests in flight (`trainer.max_inflight_tasks`) or a looser bound
  (`trainer.max_staleness`), and the verdict says so instead of asking for more generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

WAIT_SHARE_GENERATION_BOUND = 0.25  # trainer idle for a quarter of each step or more
SYNC_SHARE_WORTH_MENTIONING = 0.2
STALE_SHARE_WORTH_FIXING = 0.10  # a tenth of the generated samples thrown away is compute worth getting back

DROPPED_STALE = "sample/dropped_stale_total"  # TRL's per-window count of samples dropped as too stale
SAMPLES_TRAINED = "batch/samples_per_step"
GENERATED = "rollout/samples_generated_total"  # counted by agrpo's rollout loop (agrpo/trainer/rollout/admission.py)
INFLIGHT_TARGET = "rollout/inflight_target"  # logged while trainer.max_inflight_tasks=auto sizes it

REPLICAS_KNOB = "add replicas (inference.replicas)"
GENERATION_KNOBS = f"{REPLICAS_KNOB} or requests in flight (trainer.max_inflight_tasks)"
SYNC_KNOB = "sync less often (trainer.weight_sync_steps)"
STALE_KNOBS = (
    "lower trainer.max_inflight_tasks (fewer requests in flight, so fewer finish too late) or raise "
    "trainer.max_staleness (accept older samples)"
)
STALE_KNOBS_AUTO = (  # the controller already sizes requests in flight: what is left is the bound, or capacity
    "raise trainer.max_staleness (accept older samples) or speed up generation (inference.replicas)"
)
GENERATION_KNOBS_AUTO = (  # requests in flight are already at what the staleness bound allows, or growing to it
    f"{REPLICAS_KNOB}, or let more samples be ahead of the trainer: raise trainer.max_staleness or "
    "trainer.weight_sync_steps (the in-flight budget is at most samples per step x weight_sync_steps x max_staleness)"
)
TRAINER_KNOBS = (
    "speed up steps: packed batches (trainer.token_budget), trainer.gradient_checkpointing=false if "
    "memory allows, more trainer GPUs"
)


@dataclass(frozen=True)
class Verdict:
    kind: str  # "generation-bound" | "trainer-bound" | "balanced" | "no learning signal" (without_signal)
    line: str
    stale_share: float | None = None  # share of generated samples dropped as stale; None when TRL logged no counts
    facts: str = ""  # the figures the line quotes: step time, the trainer's wait, sync, queue, stale share


def _mean(window: list[dict[str, Any]], key: str) -> float | None:
    values = [float(entry[key]) for entry in window if entry.get(key) is not None]
    return fmean(values) if values else None


def stale_counts(window: list[dict[str, Any]]) -> tuple[float, float]:
    """(samples dropped as stale, samples trained) summed over the window."""
    dropped = sum(float(entry.get(DROPPED_STALE) or 0.0) for entry in window)
    trained = sum(float(entry.get(SAMPLES_TRAINED) or 0.0) for entry in window)
    return dropped, trained


def stale_share(window: list[dict[str, Any]]) -> float | None:
    """Share of the generated samples that TRL dropped as stale; None when nothing was counted."""
    dropped, trained = stale_counts(window)
    return dropped / (dropped + trained) if dropped + trained > 0 else None


def sample_accounting(window: list[dict[str, Any]]) -> dict[str, float | None]:
    """Where the generated samples went: used (trained), dropped as stale, left over when the run ended (in flight,
    queued, or in the batch the data loader fetches one step ahead). `generated` is None when the rollout loop did
    not count them (TRL's own loop)."""
    dropped, used = stale_counts(window)
    counted = [float(entry[GENERATED]) for entry in window if entry.get(GENERATED) is not None]
    generated = sum(counted) if counted else None
    left = max(generated - used - dropped, 0.0) if generated is not None else None
    return {"generated": generated, "used": used, "dropped_stale": dropped, "left_at_end": left}


def accounting_line(accounting: dict[str, float | None]) -> str:
    """One line for the end of a run: generated, used, dropped and why."""
    used, dropped, generated = accounting["used"], accounting["dropped_stale"], accounting["generated"]
    share = dropped / (dropped + used) if dropped + used else 0.0
    parts = [f"generated {generated:,.0f}"] if generated is not None else []
    parts += [
        f"used {used:,.0f}",
        f"dropped {dropped:,.0f} as stale ({share:.0%}: more than trainer.max_staleness versions old when trained)",
    ]
    if accounting["left_at_end"] is not None:
        parts.append(f"{accounting['left_at_end']:,.0f} generated but not trained when the run ended")
    return ", ".join(parts)


def diagnose(window: list[dict[str, Any]]) -> Verdict | None:
    """Verdict over a window of per-step log dicts (TRL's `logs`); None when there is no timing yet."""
    step = _mean(window, "perf/step_s")
    if not step:
        return None
    wait = _mean(window, "perf/rollout_wait_s") or 0.0
    sync = _mean(window, "perf/weight_sync_s") or 0.0
    backpressure = _mean(window, "rollout/backpressure_s") or 0.0
    queue = _mean(window, "sample/rollout_queue_size") or 0.0
    dropped, trained = stale_counts(window)
    share = stale_share(window)
    wasteful = share is not None and share >= STALE_SHARE_WORTH_FIXING
    wait_share, sync_share = wait / step, sync / step
    facts = (
        f"step {step:.2f} s, trainer waited {wait_share:.0%} of it for rollouts, weight sync {sync_share:.0%}, "
        f"rollout queue {queue:.0f}"
    )
    if share is not None and dropped > 0:
        facts += f", {share:.0%} of generated samples dropped as stale ({dropped:.0f} of {dropped + trained:.0f})"
    sync_note = f"; {SYNC_KNOB}" if sync_share >= SYNC_SHARE_WORTH_MENTIONING else ""
    stale_knobs = STALE_KNOBS_AUTO if any(INFLIGHT_TARGET in entry for entry in window) else STALE_KNOBS
    if wait_share >= WAIT_SHARE_GENERATION_BOUND:
        if wasteful:  # more requests in flight would finish even later: stop the waste first
            knobs = f"first stop the waste: {stale_knobs}; then {REPLICAS_KNOB}"
        else:
            knobs = GENERATION_KNOBS_AUTO if stale_knobs is STALE_KNOBS_AUTO else GENERATION_KNOBS
        return Verdict("generation-bound", f"generation-bound ({facts}): {knobs}{sync_note}", share, facts)
    if backpressure > 0 or wasteful:
        detail = facts + (f", generator back-pressured {backpressure:.2f} s" if backpressure > 0 else "")
        knobs = f"{stale_knobs}; {TRAINER_KNOBS}" if wasteful else TRAINER_KNOBS
        return Verdict("trainer-bound", f"trainer-bound ({detail}): {knobs}", share, facts)
    return Verdict("balanced", f"balanced ({facts}): generation and training keep pace", share, facts)


def without_signal(verdict: Verdict, reason: str) -> Verdict:
    """The verdict of a run that ended without a learning signal (`reason`, from agrpo/trainer/console/notices.py): its
    steps trained nothing, so "balanced: generation and training keep pace" would read as all is well. The pace's
    advice is kept, for once it learns, when there is one."""
    line = f"no learning signal ({reason}): its steps trained nothing, whatever the pace ({verdict.facts})"
    if verdict.kind != "balanced":
        line += f"; once it learns, {verdict.line}"
    return Verdict("no learning signal", line, verdict.stale_share, verdict.facts)
