"""What the trainer and the launcher's fleet controller exchange through the run dir (inference.replicas=auto):
the trainer appends one JSON line per step with the signals the policy reads (`steps.jsonl`); the controller writes
the fleet's size and replica-seconds (`state.json`), which the trainer logs as `fleet/*` (TensorBoard,
log_history)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FLEET_DIR = "fleet"
STEPS_FILE = "steps.jsonl"
STATE_FILE = "state.json"
REPLICAS, REPLICA_SECONDS = "fleet/replicas", "fleet/replica_seconds"


def steps_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STEPS_FILE


def state_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STATE_FILE


def append_step(run_dir: str | Path, entry: dict[str, Any]) -> None:
    path = steps_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(entry) + "\n")


def write_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path = state_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def read_state(run_dir: str | Path) -> dict[str, Any]:
    """The state the controller last wrote ({} when there is none or it cannot be read)."""
    try:
        return json.loads(state_path(run_dir).read_text())
    except (OSError, ValueError):
        return {}


def fleet_figures(run_dir: str | Path) -> dict[str, float]:
    """`fleet/replicas` and `fleet/replica_seconds` as the controller last wrote them ({} before it wrote any)."""
    try:
        state = json.loads(state_path(run_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {REPLICAS: float(state["replicas"]), REPLICA_SECONDS: float(state["replica_seconds"])}


class StepReader:
    """The step entries appended since the last read (a partial last line waits for the next read)."""

    def __init__(self, run_dir: str | Path):
        self.path = steps_path(run_dir)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        entries = []
        for line in complete.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries
