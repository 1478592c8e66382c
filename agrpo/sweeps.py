"""Multirun summary: one row per sweep point (its overrides, final reward, wall time), printed when the sweep ends.

A Hydra callback (`hydra.callbacks.sweep_summary` in conf/config.yaml). It is launcher-agnostic: at the end it reads
the files every point left in its job directory (<sweep dir>/<job num>/), so points that ran sequentially (local,
accelerate), concurrently (a Hydra launcher plugin, HF Jobs) or in other processes are all found:
- `.hydra/overrides.yaml`  the point's overrides (Hydra writes it for every job);
- `metrics.json`           the trainer's summary (reward_last, reward_first, global_step, wall_time_s; on a shared
                           fleet its `shared_fleet` section: the point's share of the fleet's replica-seconds);
- `sweep_point.json`       written by this callback when the job returns in this process: status, the value returned
                           to the sweeper, the point's whole wall time (replica start included), the error if any.
The table also lands in <sweep dir>/sweep_summary.md and .json, and the points' curves (those that left a
log_history.json) overlaid in <sweep dir>/sweep_curves.png.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from agrpo.interprocess import number, read_metrics, read_record, record, signed, text

log = logging.getLogger(__name__)

POINT_FILE = "sweep_point.json"
FLEET_NOTE_RECORD = record({"name": text, "run_dir": text}, keep_unknown=True)
FLEET_SUMMARY = record({"replica_seconds": number, "up_s": number}, keep_unknown=True)
POINT_RECORD = record({"status": text, "return_value": signed, "wall_s": number, "error": text}, keep_unknown=True)
ERROR_FILE = "error.txt"  # a failed point's one-paragraph error (written by the CLI, or by contain_point_error)
TRACEBACK_FILE = "traceback.txt"  # the traceback of a point's error that is not agrpo's
SUMMARY_NAME = "sweep_summary"
CURVES_PNG = "sweep_curves.png"
# Failed points of the last sweep summarised in this process; `agrpo` exits non-zero when there are any.
LAST_SWEEP_FAILURES: list[str] = []


@dataclass
class PointRow:
    job: str
    overrides: list[str]
    status: str  # ok | failed | no metrics (e.g. a dry run, or a remote trainer whose metrics stay on the bucket)
    reward_last: float | None = None
    reward_first: float | None = None
    steps: int | None = None
    wall_s: float | None = None  # the whole point: replicas start, training, teardown
    train_s: float | None = None  # the trainer process alone (metrics.json)
    error: str | None = None
    fleet_share: float | None = None  # on a shared fleet: the point's share of its replica-seconds (0..1)
    fleet_replica_s: float | None = None  # ... and those replica-seconds (attributed by the tokens it was served)


def read_point(job_dir: Path) -> PointRow:
    """One point's row from the files in its job directory."""
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    metrics = read_metrics(job_dir / "metrics.json")  # a bad one is counted, logged once, and reads as none
    point = read_record(job_dir / POINT_FILE, POINT_RECORD, default={}, non_finite="null")
    status = "failed" if point.get("status") == "failed" else ("ok" if "reward_last" in metrics else "no metrics")
    reward_last = metrics.get("reward_last", point.get("return_value"))
    return PointRow(
        job=job_dir.name,
        overrides=list(overrides or []),
        status=status,
        reward_last=reward_last,
        reward_first=metrics.get("reward_first"),
        steps=metrics.get("global_step"),
        wall_s=point.get("wall_s"),
        train_s=metrics.get("wall_time_s"),
        error=point.get("error"),
        fleet_share=fleet_figure(metrics, "share_of_fleet"),
        fleet_replica_s=fleet_figure(metrics, "replica_seconds_share"),
    )


def fleet_figure(metrics: dict[str, Any], key: str) -> float | None:
    """A number from metrics.json's `shared_fleet` section (agrpo/trainer/sync/tenant_lease.py: `share_of_fleet`, the
    fraction; `replica_seconds_share`, the run's replica-seconds), or None."""
    section = metrics.get("shared_fleet")
    value = section.get(key) if isinstance(section, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def collect_points(sweep_dir: Path) -> list[PointRow]:
    """Every job directory under the sweep dir (those with .hydra/), in job-number order."""
    jobs = [d for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()] if sweep_dir.is_dir() else []
    return [read_point(d) for d in sorted(jobs, key=lambda d: (0, int(d.name)) if d.name.isdigit() else (1, d.name))]


def varying_overrides(rows: list[PointRow]) -> tuple[list[str], list[list[str]]]:
    """(overrides every point shares, each point's own): the table shows only what the sweep varies."""
    common = [o for o in rows[0].overrides if all(o in row.overrides for row in rows)] if rows else []
    return common, [[o for o in row.overrides if o not in common] for row in rows]


def render_table(rows: list[PointRow]) -> str:
    """A Markdown table, one row per point, best final reward marked."""
    common, own = varying_overrides(rows)
    scored = [row.reward_last for row in rows if row.reward_last is not None]
    best = max(scored) if scored else None
    header = ["job", "overrides", "status", "reward last 5", "reward first 5", "steps", "wall", "trainer"]
    shared = any(
        row.fleet_share is not None or row.fleet_replica_s is not None for row in rows
    )  # a sweep on a shared fleet: each point's share
    header += ["fleet share"] if shared else []
    lines = [
        f"sweep of {len(rows)} point(s); common overrides: {' '.join(common) or '(none)'}",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row, mine in zip(rows, own):
        mark = " (best)" if best is not None and row.reward_last == best and len(scored) > 1 else ""
        cells = [
            row.job,
            " ".join(mine) or "-",
            row.status,
            _num(row.reward_last) + mark,
            _num(row.reward_first),
            "-" if row.steps is None else str(row.steps),
            _secs(row.wall_s),
            _secs(row.train_s),
        ] + ([_share(row.fleet_share, row.fleet_replica_s)] if shared else [])
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"job {row.job} failed: {row.error}" for row in rows if row.error]
    return "\n".join(lines)


class SweepSummary(Callback):
    """Records each point as it ends (same process only) and prints the table when the multirun ends."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        self.started[config.hydra.runtime.output_dir] = time.monotonic()

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        if str(config.hydra.mode) != "RunMode.MULTIRUN":
            return
        job_dir = Path(config.hydra.runtime.output_dir)
        value = job_return._return_value  # .return_value re-raises a failed job's exception
        if isinstance(value, Exception) and os.environ.get("AGRPO_DEBUG") != "1":
            contain_point_error(job_return, job_dir)  # it costs this point only (AGRPO_DEBUG=1: Hydra raises it)
        now = time.monotonic()
        failed = job_return.status.name == "FAILED" or isinstance(value, BaseException) or _error_of(job_dir)
        record = {
            "status": "failed" if failed else "completed",
            "return_value": value if isinstance(value, (int, float)) else None,
            "wall_s": now - self.started.pop(str(job_dir), now),  # (a point never started here: 0, not below it)
            "error": _error_of(job_dir) or (repr(value) if isinstance(value, BaseException) else None),
        }
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / POINT_FILE).write_text(json.dumps(record, indent=2))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect_points(sweep_dir)
        if not rows:
            return
        table = render_table(rows) + fleet_line(sweep_dir)
        (sweep_dir / f"{SUMMARY_NAME}.md").write_text(table + "\n")
        (sweep_dir / f"{SUMMARY_NAME}.json").write_text(json.dumps([asdict(row) for row in rows], indent=2))
        curves = plot_points(sweep_dir, rows)
        also = f"{sweep_dir / SUMMARY_NAME}.md" + (f", curves in {curves}" if curves else "")
        print(f"\n{table}\n(also in {also})", flush=True)
        LAST_SWEEP_FAILURES[:] = [row.job for row in rows if row.status == "failed"]


def fleet_line(sweep_dir: Path) -> str:
    """A line under the table for a sweep on a shared fleet (agrpo/sweep_fleet.py's note): the fleet's replica-seconds
    from its fleet_summary.json, once it has stopped; '' otherwise."""
    from agrpo.sweep_fleet import FLEET_NOTE

    note = read_record(sweep_dir / FLEET_NOTE, FLEET_NOTE_RECORD, default={})
    if not note.get("name"):
        return ""
    summary = read_record(Path(note.get("run_dir") or sweep_dir) / "fleet_summary.json", FLEET_SUMMARY, default={})
    started = "started and stopped by this sweep" if note.get("started_by_sweep") else "already up, left running"
    if summary.get("replica_seconds") is None:
        return f"\nfleet {note['name']} ({started}): no fleet_summary.json yet"
    return (
        f"\nfleet {note['name']} ({started}): {summary['replica_seconds']:.0f} replica-seconds in all, "
        f"up {summary.get('up_s') or 0:.0f} s (its summary: {Path(note['run_dir']) / 'fleet_summary.json'})"
    )


def plot_points(sweep_dir: Path, rows: list[PointRow]) -> Path | None:
    """The curves of every point that left a log history, overlaid and labelled by what the point varies; None when
    no point has one. A picture that cannot be drawn is a warning, never a failed sweep."""
    from agrpo.plot import LOG_HISTORY_FILE

    _, own = varying_overrides(rows)
    points = [
        (sweep_dir / row.job, " ".join(mine) or f"job {row.job}")
        for row, mine in zip(rows, own)
        if (sweep_dir / row.job / LOG_HISTORY_FILE).is_file()
    ]
    if not points:
        return None
    try:
        from agrpo.plot import plot_runs

        return plot_runs(
            [d for d, _ in points],
            sweep_dir / CURVES_PNG,
            labels=[label for _, label in points],
            title=f"sweep {sweep_dir.name}: {len(points)} point(s)",
        )
    except Exception as error:  # matplotlib missing, a malformed history: the table still stands
        log.warning("sweep curves not drawn: %s", error)
        return None


def record_point_error(job_dir: str, message: str) -> None:
    """The CLI keeps a sweep going past a failed point; the message lands in the point's row."""
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    (Path(job_dir) / ERROR_FILE).write_text(message)


def contain_point_error(job_return: Any, job_dir: Path) -> None:
    """A point that raised an exception agrpo does not know (a bug, a package reinstalled under a running sweep; agrpo's
    own errors never get here: agrpo/cli.py records them) costs that point only: its row says why, its traceback goes
    to <job dir>/traceback.txt, and the job reads as returned None, which Hydra's sweepers take as a point without a
    value (Optuna: a failed trial) instead of raising it at the end of the batch and ending the sweep without its
    table. `agrpo` still exits non-zero at the end (LAST_SWEEP_FAILURES). Works in the process that ran the point (a
    joblib worker too: Hydra calls on_job_end there, before the job's result is sent back)."""
    from hydra.core.utils import JobStatus

    error = job_return._return_value
    job_dir.mkdir(parents=True, exist_ok=True)
    trace = job_dir / TRACEBACK_FILE
    trace.write_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    message = (
        f"{type(error).__name__}: {' '.join(str(error).split()) or '(no message)'} (not an agrpo error: a bug or a broken "
        f"install; this point failed, the sweep went on; the traceback is in {trace})"
    )
    if not _error_of(job_dir):
        record_point_error(str(job_dir), message)
    print(f"agrpo: error: sweep point {job_dir.name}: {message}", file=sys.stderr, flush=True)
    job_return.return_value = None
    job_return.status = JobStatus.COMPLETED


def _error_of(job_dir: Path) -> str | None:
    path = job_dir / ERROR_FILE
    return path.read_text().strip() if path.is_file() else None


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _share(share: float | None, replica_s: float | None) -> str:
    shown = "-" if share is None else f"{100 * share:.0f}%"
    return shown if replica_s is None else f"{shown} ({replica_s:.0f} replica-s)"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"
