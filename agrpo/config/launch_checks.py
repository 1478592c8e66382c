"""Checks of the launch in the validation pass: the run directory (with `trainer.resume`, read by its one reader,
agrpo/sync/resume.py) and launcher.accelerate's rules.

A run dir holding an earlier run's outputs (checkpoints, final adapter, metrics) is refused unless trainer.resume asks
to continue it: the check runs with the other checks against this machine, so a dry run refuses what the run would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agrpo.errors import ConfigError
from agrpo.sync.resume import resume_mode

# What a finished or checkpointed run leaves; a new run writing beside them would mix or delete them.
PREVIOUS_OUTPUTS = ("checkpoint-*", "final_adapter", "metrics.json")


def resumes(resume: Any) -> bool:
    """Whether trainer.resume asks to continue an earlier run (true, "auto" or a checkpoint path; not false/null)."""
    return resume_mode(resume)[0] != "false"


def previous_outputs(run_dir: Path) -> list[str]:
    """Names in `run_dir` that an earlier run wrote (sorted; empty for a new or missing directory)."""
    if not run_dir.is_dir():
        return []
    return sorted({path.name for pattern in PREVIOUS_OUTPUTS for path in run_dir.glob(pattern)})


def mixed_output_problem(run_dir: Path, resume: Any) -> str | None:
    """Why a run may not write into `run_dir` (an earlier run's outputs, and trainer.resume does not continue it)."""
    found = previous_outputs(run_dir)
    if not found or resumes(resume):
        return None
    shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    return (
        f"the run directory {run_dir} already holds an earlier run's outputs ({shown}); a new run there would mix "
        "its logs, adapters and checkpoints with them. Continue that run with trainer.resume=true, or start a "
        "fresh one elsewhere by changing hydra.run.dir (or sync.output_dir)"
    )


def refuse_mixed_outputs(run_dir: Path, resume: Any) -> None:
    """ConfigError when `run_dir` holds an earlier run's outputs and trainer.resume does not ask to continue it."""
    problem = mixed_output_problem(Path(run_dir), resume)
    if problem:
        raise ConfigError(problem)


def run_dir_problems(cfg: DictConfig) -> list[str]:
    """The check for the run dir on this machine. A Jobs run's folder is in the bucket, where the trainer Job decides
    whether to resume (agrpo/launchers/hf_jobs/trainer.py) and its executor checks again once it has."""
    if cfg.launcher.name == "hf_jobs" or not cfg.sync.output_dir:
        return []
    problem = mixed_output_problem(Path(str(cfg.sync.output_dir)).expanduser(), cfg.trainer.resume)
    return [problem] if problem else []


def trains_under_accelerate(cfg: DictConfig) -> bool:
    """launcher=accelerate, or a trainer Job whose inner launcher is accelerate."""
    launcher = cfg.launcher
    return launcher.name == "accelerate" or (
        launcher.name == "hf_jobs" and launcher.hf_jobs.trainer_launcher == "accelerate"
    )


def accelerate_problems(cfg: DictConfig) -> list[str]:
    """launcher.accelerate's rules, where the trainer runs under accelerate (the planner guards with the same
    function)."""
    if not trains_under_accelerate(cfg):
        return []
    knobs = cfg.launcher.accelerate
    if knobs.activation_checkpointing and cfg.trainer.gradient_checkpointing:
        return [
            "launcher.accelerate.activation_checkpointing and trainer.gradient_checkpointing both "
            "recompute activations: under FSDP keep only launcher.accelerate.activation_checkpointing=true"
        ]
    return []
