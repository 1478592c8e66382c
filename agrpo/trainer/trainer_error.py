"""The trainer's one-paragraph error, shown once: by the launcher, as its own error, with where the outputs are.

The local plan gives the trainer AGRPO_TRAINER_ERROR_FILE (`<run_dir>/logs/trainer_error.txt`). A trainer that stops
on a user-facing error (a reward that raised, a row that cannot be rendered, a config problem found late) writes the
paragraph there instead of printing it; the launcher, seeing the trainer exit non-zero, raises it as its own error
followed by what the run directory keeps. A trainer started without the variable prints the paragraph itself.

The file is never left empty: it is written whole (a temporary file renamed over it). When the run folder's disk is
full (issue 42: a 0-byte trainer_error.txt, the paragraph lost), the paragraph and the traceback go to a folder on
the temp disk that only this user can write (`spill_dir`: this user's runtime folder, /tmp/agrpo-<uid>/errors, mode
0700, owner checked, files opened without following links), keyed by the error file's path; the launcher reads it there.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from agrpo.errors import LaunchError
from agrpo.processes.private_dir import runtime_dir

TRAINER_ERROR_ENV = "AGRPO_TRAINER_ERROR_FILE"
TRAINER_ERROR_FILE = "logs/trainer_error.txt"
# What spill_file may hold per error file: the paragraph, its traceback, and those kept by disk_full_quiet.py
SPILL_SUFFIXES = (".txt", ".traceback.txt", ".main.traceback.txt", ".thread.traceback.txt", ".log.traceback.txt")


def trainer_error_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / TRAINER_ERROR_FILE


def spill_dir() -> Path | None:
    """<runtime dir>/errors (agrpo/processes/private_dir.py: this user's, 0700, owner checked, no link followed);
    None when it cannot be had (another user could otherwise plant a link or read the paragraph there)."""
    try:
        return runtime_dir("errors")
    except (LaunchError, OSError):
        return None


def spill_file(error_file: str | Path, suffix: str = ".txt") -> Path | None:
    """Where the paragraph (".txt") or traceback (".traceback.txt") of `error_file` goes when its disk is full."""
    folder = spill_dir()
    key = hashlib.sha256(os.path.abspath(error_file).encode()).hexdigest()[:16]
    return folder / f"{key}{suffix}" if folder else None


def write_whole(path: Path, text: str) -> bool:
    """`text` into `path` whole or not at all (never an empty file); False when it cannot be written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        with os.fdopen(os.open(partial, flags, 0o600), "w") as out:
            out.write(text)
        partial.replace(path)
        return True
    except OSError:
        partial.unlink(missing_ok=True)
        return False


def report_trainer_error(message: str) -> None:
    """Trainer side: hand the paragraph to the launcher (in the run folder, else in `spill_dir` with the traceback of
    the error being handled), or print it when neither can be written or no launcher asked for it."""
    path = os.environ.get(TRAINER_ERROR_ENV)
    text = message.strip() + "\n"
    if path:
        if write_whole(Path(path), text):
            return
        spilled = spill_file(path)
        handling = sys.exc_info()[1]
        if spilled is not None and write_whole(spilled, text):
            if handling is not None:
                write_whole(spill_file(path, ".traceback.txt"), "".join(traceback.format_exception(handling)))
            return
    print(f"agrpo trainer: {message}", file=sys.stderr)


def clear_trainer_error(run_dir: str | Path) -> None:
    """Launcher side, before the trainer starts: an earlier attempt's paragraph must not be shown for this one."""
    path = trainer_error_file(run_dir)
    for stale in (path, *(spill_file(path, suffix) for suffix in SPILL_SUFFIXES)):
        if stale is not None:
            stale.unlink(missing_ok=True)


def _read(path: Path | None) -> str:
    try:
        return path.read_text().strip() if path is not None else ""
    except OSError:
        return ""


def trainer_failure(run_dir: str | Path, code: int) -> str:
    """Launcher side: the error to raise for a trainer that exited with `code`."""
    path = trainer_error_file(run_dir)
    keeps = f"the run directory {run_dir} keeps the checkpoints, adapters and logs written so far"
    reported, full = _read(path), "full log: logs/trainer.log"
    if not reported and (reported := _read(spill_file(path))):
        traced = spill_file(path, ".traceback.txt")
        full = f"its disk was full; traceback: {traced}" if traced and traced.is_file() else "its disk was full"
    if reported:
        return f"{reported.rstrip('.')}. The trainer exited with code {code}; {keeps} ({full})"
    return f"the trainer exited with code {code} (its output is above); {keeps}"


def trainer_still_running(trainer: Any, run_dir: Path) -> None:
    """Launcher side, for a `ManagedProcess` trainer: raise the trainer's own error if it exited while the services
    were still starting (a trainer started with the replicas fails at once, not after their boot)."""
    code = trainer.exit_code
    if code is not None:
        raise LaunchError(
            f"{trainer_failure(run_dir, code)}. It ended while the replicas were still starting; they were stopped"
        )
