"""Run directories on a shared machine: a name no other run can get, and no silent reuse of an earlier run's outputs.

`${agrpo_run_suffix:}` (used by hydra.run.dir in conf/config.yaml) is `<pid>-<4 random hex digits>`, made once per
process: two runs started in the same second differ by pid on one machine, and by the random part across
machines sharing a filesystem. It is made once because Hydra may resolve hydra.run.dir more than once.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agrpo.errors import ConfigError

RESOLVER = "agrpo_run_suffix"
_SUFFIX: list[str] = []
# What a finished or checkpointed run leaves; a new run writing beside them would mix or delete them.
PREVIOUS_OUTPUTS = ("checkpoint-*", "final_adapter", "metrics.json")


def run_suffix() -> str:
    if not _SUFFIX:
        _SUFFIX.append(f"{os.getpid()}-{secrets.token_hex(2)}")
    return _SUFFIX[0]


def register_run_dir_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, run_suffix)


def previous_outputs(run_dir: Path) -> list[str]:
    """Names in `run_dir` that an earlier run wrote (sorted; empty for a new or missing directory)."""
    if not run_dir.is_dir():
        return []
    return sorted({path.name for pattern in PREVIOUS_OUTPUTS for path in run_dir.glob(pattern)})


def resumes(resume: Any) -> bool:
    """Whether trainer.resume asks to continue an earlier run (true, "auto" or a checkpoint path; not false/null)."""
    if isinstance(resume, str):
        return resume.strip().lower() not in ("", "false", "no", "0", "none", "null")
    return bool(resume)


def refuse_mixed_outputs(run_dir: Path, resume: Any) -> None:
    """ConfigError when `run_dir` holds an earlier run's outputs and trainer.resume does not ask to continue it."""
    found = previous_outputs(run_dir)
    if found and not resumes(resume):
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise ConfigError(
            f"the run directory {run_dir} already holds an earlier run's outputs ({shown}); a new run there would mix "
            "its logs, adapters and checkpoints with them. Continue that run with trainer.resume=true, or start a "
            "fresh one elsewhere by changing hydra.run.dir (or sync.output_dir)"
        )
