"""The policy's signals from what the run writes and serves (pure): the trainer's step entries (files.py) and each
replica's vLLM `/metrics`."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agrpo.fleet.policy import Signals

STEP_S, WAIT_S = "perf/step_s", "perf/rollout_wait_s"  # TRL's step time and its wait for rollouts in it
# On a shared fleet: seconds the tenant's requests waited at the proxy's fair-share gate since its previous step entry
# (the proxy's gate_wait_s, added to its entries by files.TenantSteps: `with_gate_waits`)
GATE_WAIT_S = "perf/gate_wait_s"
DROPPED_STALE, TRAINED = "sample/dropped_stale_total", "batch/samples_per_step"
INFLIGHT_TARGET = "rollout/inflight_target"  # logged while trainer.max_inflight_tasks=auto sizes the budget
STEP_KEYS = (STEP_S, WAIT_S, DROPPED_STALE, TRAINED, INFLIGHT_TARGET)  # what the trainer writes per step
# Steps within which a budget that can still grow does grow: its controller decides every max_staleness x
# weight_sync_steps + 2 steps while the trainer waits (agrpo/trainer/rollout/inflight.py), so about three chances
BUDGET_LOOKBACK = 12

WAITING, RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
KV_USE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # vLLM V1's name, then the older one
KV_BUSY = 0.5  # a KV cache over half full counts as a busy replica

_PROM_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def prometheus_values(text: str) -> dict[str, float]:
    """Each metric's value summed over its series (labels ignored), from Prometheus text; a value that is not a
    finite number (NaN, +Inf: legal in the format, meaningless as a load) is left out."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _PROM_LINE.match(line)
        if match:
            try:
                value = float(match.group("value"))
            except ValueError:
                continue
            if not math.isfinite(value):
                continue
            totals[match.group("name")] = totals.get(match.group("name"), 0.0) + value
    return totals


def replica_load(metrics_text: str) -> tuple[float, float, float]:
    """(requests waiting, requests running, KV-cache use 0..1) of one replica."""
    values = prometheus_values(metrics_text)
    kv = next((values[name] for name in KV_USE if name in values), 0.0)
    return values.get(WAITING, 0.0), values.get(RUNNING, 0.0), kv


def busy_share(loads: Sequence[tuple[float, float, float] | None]) -> float | None:
    """Share of the replicas that answered with a request queued or a KV cache over KV_BUSY full."""
    known = [load for load in loads if load is not None]
    if not known:
        return None
    return sum(1 for waiting, _, kv in known if waiting > 0 or kv > KV_BUSY) / len(known)


def serving_replicas(stats: dict[str, Any]) -> int:
    """Healthy replicas behind the proxy, from its /proxy/stats answer (typed: agrpo.interprocess.PROXY_STATS)."""
    return sum(1 for replica in stats.get("replicas", []) if replica.get("healthy"))


def _total(entries: Sequence[dict[str, Any]], key: str) -> float:
    return sum(float(entry.get(key) or 0.0) for entry in entries)


def starvation(wait_s: float, gate_s: float, step_s: float) -> float | None:
    """The share of a run's step time it was starved of rollouts (None without a timed step): its own wait for them
    or, on a shared fleet, the time its requests waited at the proxy's fair-share gate, whichever is larger. The gate
    holds a tenant's requests back when the replicas' slots are all shared out, so vLLM's own queue (busy_share) does
    not see that demand, and a trainer that keeps a full in-flight budget may not wait yet while its rollouts already
    queue: either way more replicas would serve it sooner. The larger, not the sum: a wait at the gate is usually
    part of the trainer's own wait, not in addition to it."""
    if step_s <= 0:
        return None
    return min(max(wait_s, gate_s) / step_s, 1.0)


def gate_deltas(totals: dict[str, float], seen: dict[str, float]) -> dict[str, float]:
    """Each tenant's gate wait since the last reading, from the proxy's running totals (pure; `seen` is updated). A
    total below the one seen (a restarted proxy, a tenant registered again) counts from zero; a tenant gone from
    `totals` is forgotten."""
    deltas = {}
    for tenant, total in totals.items():
        before = seen.get(tenant, 0.0)
        deltas[tenant] = total - before if total >= before else total
        seen[tenant] = total
    for tenant in [t for t in seen if t not in totals]:
        del seen[tenant]
    return deltas


def with_gate_waits(entries: list[dict[str, Any]], owed: dict[str, float]) -> list[dict[str, Any]]:
    """The tagged entries with each tenant's gate wait owed (`owed`: seconds not yet given to a step; updated) put on
    its last entry, as GATE_WAIT_S; a tenant with no new step keeps its wait owed until its next one (pure)."""
    last = {str(entry[TENANT]): index for index, entry in enumerate(entries) if TENANT in entry}
    out = list(entries)
    for tenant, index in last.items():
        waited = owed.pop(tenant, 0.0)
        if waited > 0:
            out[index] = {**out[index], GATE_WAIT_S: waited}
    return out


def budget_rising(targets: Sequence[float]) -> bool:
    """Whether the in-flight budget rose within its last BUDGET_LOOKBACK steps (True while fewer are known)."""
    if len(targets) <= BUDGET_LOOKBACK:
        return True
    recent = targets[-BUDGET_LOOKBACK - 1 :]
    return recent[-1] > recent[0]


def budget_cut(targets: Sequence[float]) -> bool:
    """Whether the in-flight budget was lowered within its last BUDGET_LOOKBACK steps: its controller is answering
    stale drops (agrpo/trainer/rollout/inflight.py), and after a cut it climbs back only one sample at a time."""
    recent = targets[-BUDGET_LOOKBACK - 1 :]
    return any(later < earlier for earlier, later in zip(recent, recent[1:]))


def window_signals(
    entries: Sequence[dict[str, Any]],
    now: float,
    replicas: int,
    inflight_ceiling: float | None = None,
    busy: float | None = None,
    changing: bool = False,
) -> Signals:
    """The Signals of a window of step entries (those logged since the last change took effect); entries tagged
    with their TENANT (a shared fleet's, files.TenantSteps) are combined across tenants (`combine_tenants`)."""
    if any(TENANT in entry for entry in entries):
        by_tenant = {
            tenant: run_signals(steps, now, replicas, inflight_ceiling, busy, changing)
            for tenant, steps in per_tenant(entries).items()
        }
        return combine_tenants(by_tenant, now, replicas, busy, changing)
    return run_signals(entries, now, replicas, inflight_ceiling, busy, changing)


def run_signals(
    entries: Sequence[dict[str, Any]],
    now: float,
    replicas: int,
    inflight_ceiling: float | None = None,
    busy: float | None = None,
    changing: bool = False,
) -> Signals:
    """The Signals of one trainer's step entries."""
    timed = [entry for entry in entries if entry.get(STEP_S)]
    step_time = _total(timed, STEP_S)
    dropped, trained = _total(entries, DROPPED_STALE), _total(entries, TRAINED)
    targets = [float(entry[INFLIGHT_TARGET]) for entry in entries if entry.get(INFLIGHT_TARGET) is not None]
    return Signals(
        now=now,
        replicas=replicas,
        steps=len(timed),
        steps_per_s=len(timed) / step_time if step_time > 0 else None,
        wait_share=starvation(_total(timed, WAIT_S), _total(entries, GATE_WAIT_S), step_time),
        stale_share=dropped / (dropped + trained) if dropped + trained > 0 else None,
        inflight_target=targets[-1] if targets else None,
        inflight_ceiling=inflight_ceiling if targets else None,
        inflight_rising=budget_rising(targets),
        inflight_cut=budget_cut(targets),
        busy_share=busy,
        changing=changing,
    )


# ---------------------------------------------------------------------------- a shared fleet's tenants
TENANT = "tenant"  # the tag files.TenantSteps puts on each step entry of a shared fleet: whose step it is


def per_tenant(entries: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The tagged entries by tenant, in their order (untagged ones are left out)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        if TENANT in entry:
            grouped.setdefault(str(entry[TENANT]), []).append(entry)
    return grouped


def latest(entries: Sequence[dict[str, Any]], count: int, tenants: Any = None) -> list[dict[str, Any]]:
    """The window's latest `count` steps: untagged, its last `count` entries (a run's fleet); tagged, each tenant's
    last `count` (one tenant stepping fast must not push another's steps out), of the `tenants` still attached when
    given (a run that left stops counting)."""
    if not any(TENANT in entry for entry in entries):
        return list(entries[-count:])
    kept = [steps[-count:] for tenant, steps in per_tenant(entries).items() if tenants is None or tenant in tenants]
    return [entry for steps in kept for entry in steps]


def combine_tenants(
    by_tenant: dict[str, Signals], now: float, replicas: int, busy: float | None = None, changing: bool = False
) -> Signals:
    """One fleet's Signals from its tenants' (each measured on its own steps). The policy acts for the most starved
    tenant: its wait share (the max: the fleet grows when ANY tenant waits for rollouts, and releases only when
    ALL hardly wait), its steps (the evidence the window needs), its stale share and in-flight budget (what an
    addition would feed). Steps/s is the tenants' sum (the fleet's throughput, which an addition must raise). Ties
    go to the tenant with more steps; tenants without a timed step are left out (none: no steps measured)."""
    timed = [signals for signals in by_tenant.values() if signals.wait_share is not None]
    if not timed:
        return Signals(now=now, replicas=replicas, busy_share=busy, changing=changing, steps=0)
    lead = max(timed, key=lambda signals: (signals.wait_share, signals.steps))
    rates = [signals.steps_per_s for signals in timed if signals.steps_per_s is not None]
    return replace(
        lead, now=now, replicas=replicas, steps_per_s=sum(rates) if rates else None, busy_share=busy, changing=changing
    )
