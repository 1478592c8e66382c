"""What the trainer and the launcher's fleet controller exchange through the run dir (inference.replicas=auto):
the trainer appends one JSON line per step with the signals the policy reads (`steps.jsonl`); the controller writes
the fleet's size and replica-seconds (`state.json`), which the trainer logs as `fleet/*` (TensorBoard,
log_history).

Both are read through agrpo/interprocess.py: a bad step line (not an object, not JSON, NaN, a string where a number
goes) is skipped and counted, never handed on; a bad state.json reads as none.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agrpo.interprocess import SKIPPED, Skipped, digits, integer, mapping, number, numbers, parse_lines, read_record
from agrpo.interprocess import record

FLEET_DIR = "fleet"
STEPS_FILE = "steps.jsonl"
STATE_FILE = "state.json"
REPLICAS, REPLICA_SECONDS = "fleet/replicas", "fleet/replica_seconds"


def steps_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STEPS_FILE


def state_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STATE_FILE


STATE_RECORD = record(
    {
        "replicas": integer,
        "replica_seconds": number,
        "seconds_by_size": mapping(number, key=digits),
        "max_replicas": integer,
        "samples": integer,
        "lost": integer,
        "replaced": integer,
        "skipped": integer,
    }
)


def append_step(run_dir: str | Path, entry: dict[str, Any]) -> None:
    """One line; a figure that is not a finite number is left out (the reader would reject the line)."""
    path = steps_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    finite = {k: v for k, v in entry.items() if type(v) in (int, float) and math.isfinite(v)}  # not bool, NaN
    with path.open("a") as out:
        out.write(json.dumps(finite) + "\n")


def write_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path = state_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def read_state(run_dir: str | Path, skipped: Skipped = SKIPPED) -> dict[str, Any]:
    """The state the controller last wrote, its fields typed ({} when there is none; a bad one is counted)."""
    return read_record(state_path(run_dir), STATE_RECORD, skipped, default={})


def fleet_figures(run_dir: str | Path) -> dict[str, float]:
    """`fleet/replicas` and `fleet/replica_seconds` as the controller last wrote them ({} before it wrote any)."""
    state = read_state(run_dir)
    if "replicas" not in state or "replica_seconds" not in state:
        return {}
    return {REPLICAS: float(state["replicas"]), REPLICA_SECONDS: state["replica_seconds"]}


class StepReader:
    """The step entries appended since the last read (a partial last line waits for the next read), each an object
    of non-negative finite numbers; every other line is skipped and counted in `skipped`."""

    def __init__(self, run_dir: str | Path, skipped: Skipped | None = None):
        self.path = steps_path(run_dir)
        self.offset = 0
        self.lines = 0  # complete lines read so far (to name a bad one's number)
        self.skipped = skipped if skipped is not None else Skipped()

    def read(self) -> list[dict[str, float]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        entries = parse_lines(complete[:-1], numbers, STEPS_FILE, self.skipped, first_line=self.lines + 1)
        self.lines += complete.count(b"\n")
        return entries
