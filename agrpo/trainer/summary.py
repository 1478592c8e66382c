"""The run's figures for metrics.json, read from the trainer's log history (pure)."""

from __future__ import annotations

import math
from typing import Any

from agrpo.rewards.unscored import UNSCORED_METRIC


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
    return summary
