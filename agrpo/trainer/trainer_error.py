"""The trainer's one-paragraph error, shown once: by the launcher, as its own error, with where the outputs are.

The local plan gives the trainer AGRPO_TRAINER_ERROR_FILE (`<run_dir>/logs/trainer_error.txt`). A trainer that stops
on a user-facing error (a reward that raised, a row that cannot be rendered, a config problem found late) writes the
paragraph there instead of printing it; the launcher, seeing the trainer exit non-zero, raises it as its own error
followed by what the run directory keeps. A trainer started without the variable prints the paragraph itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agrpo.errors import LaunchError

TRAINER_ERROR_ENV = "AGRPO_TRAINER_ERROR_FILE"
TRAINER_ERROR_FILE = "logs/trainer_error.txt"


def trainer_error_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / TRAINER_ERROR_FILE


def report_trainer_error(message: str) -> None:
    """Trainer side: hand the paragraph to the launcher, or print it when no launcher asked for it."""
    path = os.environ.get(TRAINER_ERROR_ENV)
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(message.strip() + "\n")
            return
        except OSError:
            pass
    print(f"agrpo trainer: {message}", file=sys.stderr)


def clear_trainer_error(run_dir: str | Path) -> None:
    """Launcher side, before the trainer starts: an earlier attempt's paragraph must not be shown for this one."""
    trainer_error_file(run_dir).unlink(missing_ok=True)


def trainer_failure(run_dir: str | Path, code: int) -> str:
    """Launcher side: the error to raise for a trainer that exited with `code`."""
    path = trainer_error_file(run_dir)
    keeps = f"the run directory {run_dir} keeps the checkpoints, adapters and logs written so far"
    try:
        reported = path.read_text().strip()
    except OSError:
        reported = ""
    if reported:
        return f"{reported.rstrip('.')}. The trainer exited with code {code}; {keeps} (full log: logs/trainer.log)"
    return f"the trainer exited with code {code} (its output is above); {keeps}"


def trainer_still_running(trainer: Any, run_dir: Path) -> None:
    """Launcher side, for a `ManagedProcess` trainer: raise the trainer's own error if it exited while the services
    were still starting (a trainer started with the replicas fails at once, not after their boot)."""
    code = trainer.exit_code
    if code is not None:
        raise LaunchError(
            f"{trainer_failure(run_dir, code)}. It ended while the replicas were still starting; they were stopped"
        )
