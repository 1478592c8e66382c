"""The run's figures for metrics.json, read from the trainer's log history (pure)."""

from __future__ import annotations

import math
import re
from typing import Any

from agrpo.rewards.unscored import UNSCORED_METRIC

# per-replica figures agrpo/trainer/console/serving_metrics.py logs from /proxy/stats: routed, pace, stale (cumulative)
PER_REPLICA = re.compile(r"^proxy/replica(\d+)/(routed|pace|stale)$")


def final_metrics(log_history: list[dict[str, Any]], window: int = 5, warmup_steps: int = 2) -> dict[str, Any]:
    """Summary of a run from the trainer's log history: first/last-window mean reward, steps, mean step time
    (after `warmup_steps`, whose first requests compile and warm the server)."""
    logged = [entry["reward"] for entry in log_history if "reward" in entry]
    # TRL logs `reward` as None for a step whose every completion no reward scored (agrpo/rewards/unscored.py)
    rewards = [r for r in logged if isinstance(r, (int, float)) and math.isfinite(r)]
    summary: dict[str, Any] = {"steps_logged": len(logged), "rewards": rewards}
    if len(rewards) < len(logged):
        summary["steps_unscored"] = len(logged) - len(rewards)
    unscored = sum(entry.get(UNSCORED_METRIC) or 0 for entry in log_history)
    if unscored:
        summary["unscored_completions"] = int(unscored)
    if rewards:
        summary["reward_first"] = sum(rewards[:window]) / len(rewards[:window])
        summary["reward_last"] = sum(rewards[-window:]) / len(rewards[-window:])
    step_times = [entry["perf/step_s"] for entry in log_history if "perf/step_s" in entry][warmup_steps:]
    if step_times:
        summary["step_s_mean"] = sum(step_times) / len(step_times)
    for entry in log_history:
        if "train_runtime" in entry:
            summary["train_runtime_s"] = entry["train_runtime"]
    replicas = replica_costs(log_history)
    if replicas:
        summary["replicas"] = replicas
    return summary


def replica_costs(log_history: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """What each replica behind the proxy did, from the latest proxy figures logged (cumulative): its pace (routed
    work per busy second), its share of the requests and of the stale ones (answered after their version was
    retired, or aborted then: certainly dropped). A slow replica shows as a low pace with a large stale share."""
    last = next((e for e in reversed(log_history) if any(PER_REPLICA.match(k) for k in e)), None)
    if last is None:
        return {}
    figures: dict[str, dict[str, float]] = {}
    for key, value in last.items():
        found = PER_REPLICA.match(key)
        if found and isinstance(value, (int, float)):
            figures.setdefault(found.group(1), {})[found.group(2)] = float(value)
    routed = sum(f.get("routed", 0.0) for f in figures.values())
    stale = sum(f.get("stale", 0.0) for f in figures.values())
    return {
        f"replica{index}": {
            "pace_work_per_s": f.get("pace") or None,
            "routed_share": f.get("routed", 0.0) / routed if routed else None,
            "stale_share": f.get("stale", 0.0) / stale if stale else None,
        }
        for index, f in sorted(figures.items(), key=lambda item: int(item[0]))
        if "routed" in f
    }
