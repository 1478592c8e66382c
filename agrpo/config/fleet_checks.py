"""Checks of inference.replicas and, with `auto`, of the fleet's range and policy knobs (pure): each problem names
the key to change."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from agrpo.config.schema.inference import AUTO_FLEET, is_auto_fleet

# Launchers that size a fleet: local starts replica processes, hf_jobs' trainer Job launches replica Jobs.
AUTO_LAUNCHERS = ("local", "accelerate", "hf_jobs")  # accelerate: local's executor, the trainer ranked


def replicas_problems(inference: Any) -> list[str]:
    """inference.replicas is a number >= 1 or auto."""
    value = inference.replicas
    if is_auto_fleet(inference):
        return []
    try:
        count = int(str(value))
    except ValueError:
        return [f"inference.replicas={value!r} must be a number >= 1 or {AUTO_FLEET} (a fleet that sizes itself)"]
    return [] if count >= 1 else ["inference.replicas must be >= 1"]


def fleet_problems(cfg: DictConfig) -> list[str]:
    """With inference.replicas=auto: a range the launcher can start, and policy knobs that can decide."""
    inference = cfg.inference
    problems = replicas_problems(inference)
    if problems or not is_auto_fleet(inference):
        return problems
    lo, hi = inference.min_replicas, inference.max_replicas
    if lo < 1:
        problems.append("inference.min_replicas must be >= 1 (the trainer needs a replica from the first step)")
    if hi < lo:
        problems.append(f"inference.min_replicas={lo} exceeds inference.max_replicas={hi}: lower the first")
    in_trainer_job = cfg.launcher.name == "hf_jobs" and cfg.role == "trainer"  # its replica Jobs fill the urls
    if inference.urls and not in_trainer_job:
        problems.append(
            "inference.replicas=auto starts and stops its own replicas; it cannot size servers given in "
            "inference.urls: set inference.replicas to a number, or empty inference.urls"
        )
    if cfg.launcher.name not in AUTO_LAUNCHERS:
        problems.append(
            f"inference.replicas=auto is built for launcher=local, accelerate and hf_jobs so far (launcher="
            f"{cfg.launcher.name}): set inference.replicas to a number"
        )
    if cfg.role != "all" and not in_trainer_job:
        problems.append(f"inference.replicas=auto needs role=all (role={cfg.role}): the launcher starts the replicas")
    if inference.use_proxy is False:
        problems.append(
            "inference.replicas=auto puts the replicas behind agrpo's proxy (it admits and drains them at run "
            "time): drop inference.use_proxy=false"
        )
    return problems + policy_problems(inference.fleet)


def policy_problems(fleet: Any) -> list[str]:
    """The policy's knobs (inference.fleet.*)."""
    problems = []
    if fleet.window_steps < 2:
        problems.append("inference.fleet.window_steps must be >= 2 (steps/s is judged over a window)")
    if fleet.recent_steps < fleet.window_steps:
        problems.append(
            f"inference.fleet.recent_steps={fleet.recent_steps} must be >= inference.fleet.window_steps="
            f"{fleet.window_steps} (a change is judged on window_steps of the latest steps)"
        )
    if not 0.0 <= fleet.release_wait_share < fleet.add_wait_share <= 1.0:
        problems.append(
            f"inference.fleet.release_wait_share={fleet.release_wait_share} must be below "
            f"inference.fleet.add_wait_share={fleet.add_wait_share}, both shares in [0, 1] (the gap is the "
            "hysteresis that keeps the fleet from flapping)"
        )
    for key in ("cooldown_s", "backoff_s", "drain_timeout_s", "min_gain", "max_replacements", "replica_price_per_hour"):
        if getattr(fleet, key) < 0:
            problems.append(f"inference.fleet.{key} must be >= 0")
    if not 0.0 <= fleet.max_stale_share <= 1.0:
        problems.append("inference.fleet.max_stale_share must be a share in [0, 1]")
    if fleet.settle_steps < 0:
        problems.append("inference.fleet.settle_steps must be >= 0")
    if not fleet.add_wait_share <= fleet.starved_wait_share <= 1.0:
        problems.append(
            f"inference.fleet.starved_wait_share={fleet.starved_wait_share} must be between "
            f"inference.fleet.add_wait_share={fleet.add_wait_share} and 1.0 (1.0: never add before window_steps)"
        )
    if not 2 <= fleet.starved_steps <= fleet.window_steps:
        problems.append(
            f"inference.fleet.starved_steps={fleet.starved_steps} must be >= 2 and <= inference.fleet.window_steps="
            f"{fleet.window_steps} (one slow step decides nothing)"
        )
    if fleet.poll_s <= 0:
        problems.append("inference.fleet.poll_s must be > 0")
    return problems
