"""A sweep on its own fleets (one after another) against the same sweep on one shared fleet (points at once).

    flock /tmp/agrpo-dev-vllm.lock python benchmarks/shared_fleet.py --repeats 3 [--steps 30] [--points 1,4,8,16]
        [--recipe smoke] [-- extra overrides for both arms]
    flock /tmp/agrpo-dev-vllm.lock python benchmarks/shared_fleet.py --mode kill [--repeats 1] [--steps 60]
        [--kill-at 20] [--settle-s 2]   # B alone vs B after A is SIGKILLed (benchmarks/shared_fleet_kill.py)

Both arms run `python -m agrpo -m +recipe=R lora.r=<points> trainer.max_steps=S` as a user types it, in one sitting,
alternating which goes first: `sequential` as agrpo always ran a sweep (each point boots its own replica, trains,
stops it), `shared` with `inference.shared_fleet=<name>` (the points run at once on hydra-joblib-launcher, on one
fleet the sweep starts and stops: agrpo/sweep_fleet.py). For each arm and repeat, from the files the runs leave:
- wall time: the command's start to its exit;
- vLLM boots: "Initializing a V1 LLM engine" lines in every replica log (the points' own, the fleet's);
- replica-seconds: each replica from its process's start (the launcher's `starting vllm-i (log: PATH)` line, in the
  sweep's output and the fleet's log) to its log's last write (its stop), boot and vLLM's imports included, as a bill
  counts it; beside it the older figure from the log's first vLLM timestamp (which misses each boot's ~9 s of
  imports: once per point in the sequential arm, once in the shared one) and the shared fleet's own count
  (fleet_summary.json);
- each point's reward rise: metrics.json's reward_last - reward_first (mean of the last 5 steps - of the first 5).
Prints one line per run and a table of medians; asserts nothing (docs/shared_fleet.md, "Measured").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ENGINE_START = "Initializing a V1 LLM engine"
LOG_TIME = re.compile(r" (\d\d-\d\d \d\d:\d\d:\d\d) ")  # vLLM's `INFO MM-DD HH:MM:SS [file.py:N]`
# agrpo's launcher (agrpo/launchers/local.py start_services), just before a replica's process starts
PROCESS_START = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]\[agrpo\.launchers\.local\]\[INFO\] - starting vllm-\d+ \(log: (\S+)\)",
    re.M,
)
ARMS = ("sequential", "shared")

# ---- pure ---------------------------------------------------------------------------------------------------------


def boots(log_texts: list[str]) -> int:
    """vLLM engine starts in these replica logs (a restarted replica appends to its log: each start counts)."""
    return sum(text.count(ENGINE_START) for text in log_texts)


def replica_seconds(log_texts: list[str], last_writes: list[float], year: int) -> float:
    """Sum over the replica logs of their first vLLM timestamp to the log's last write (the replica's stop)."""
    total = 0.0
    for text, last_write in zip(log_texts, last_writes):
        found = LOG_TIME.search(text)
        if found:
            first = datetime.strptime(f"{year}-{found[1]}", "%Y-%m-%d %H:%M:%S").timestamp()
            total += max(0.0, last_write - first)
    return total


def process_starts(texts: list[str]) -> dict[str, float]:
    """{replica log path: unix time its process started} from the launcher's lines in these outputs (a restarted
    replica: its last start)."""
    found = {}
    for text in texts:
        for match in PROCESS_START.finditer(text):
            found[match[2]] = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


def replica_seconds_from_start(starts: dict[str, float], last_writes: dict[str, float]) -> float:
    """Sum over the replicas of their process's start to their log's last write."""
    return sum(max(0.0, last_writes[log] - started) for log, started in starts.items() if log in last_writes)


def rise(metrics: dict) -> float | None:
    """The reward's rise from the first 5 steps to the last 5 (None without both)."""
    last, first = metrics.get("reward_last"), metrics.get("reward_first")
    return None if last is None or first is None else float(last) - float(first)


def table(results: list[dict], points: list[str]) -> list[str]:
    """Markdown rows of medians per arm, and shared / sequential."""

    def median(arm: str, key: str) -> float | None:
        values = [r[arm][key] for r in results if r.get(arm) and r[arm].get(key) is not None]
        return statistics.median(values) if values else None

    lines = [f"| figure (median of {len(results)}) | sequential, own fleets | shared fleet | shared / sequential |"]
    lines.append("|---|---|---|---|")
    for key, label, spec in (
        ("wall_s", "wall time", "{:.0f} s"),
        ("boots", "vLLM boots", "{:.0f}"),
        ("replica_s_start", "replica-seconds", "{:.0f}"),  # each replica's process start to its stop
        ("replica_s", "replica-seconds from the first vLLM log line", "{:.0f}"),  # the figure before 12-07 07:00
    ):
        seq, shared = median("sequential", key), median("shared", key)
        ratio = f"{shared / seq:.2f}x" if seq and shared is not None else "-"
        cells = [spec.format(v) if v is not None else "-" for v in (seq, shared)]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    fleet = median("shared", "fleet_replica_s")
    if fleet is not None:
        lines.append(f"| replica-seconds, the fleet's own count (fleet_summary.json) | - | {fleet:.0f} | - |")
    for index, point in enumerate(points):
        cells = []
        for arm in ARMS:
            values = [r[arm]["rises"][index] for r in results if r.get(arm) and r[arm]["rises"][index] is not None]
            cells.append(f"{statistics.median(values):+.3f}" if values else "-")
        lines.append(f"| reward rise, lora.r={point} (first 5 -> last 5 steps) | {cells[0]} | {cells[1]} | - |")
    return lines


# ---- runs ---------------------------------------------------------------------------------------------------------


def replica_logs(folders: list[Path]) -> list[Path]:
    return sorted(log for folder in folders for log in folder.glob("*/logs/vllm-*.log")) + sorted(
        log for folder in folders for log in folder.glob("logs/vllm-*.log")
    )


def one_arm(arm: str, sweep_dir: Path, args: argparse.Namespace, repeat: int) -> dict:
    """One sweep, as a user runs it; its figures from the files it left."""
    argv = [
        sys.executable,
        "-m",
        "agrpo",
        "-m",
        f"+recipe={args.recipe}",
        f"lora.r={args.points}",
        f"trainer.max_steps={args.steps}",
        f"hydra.sweep.dir={sweep_dir}",
        *args.extra,
    ]
    if arm == "shared":
        argv.append(f"inference.shared_fleet=bench-{os.getpid()}-{repeat}")
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(sweep_dir.parent / f"{arm}.out", "w") as out:
        code = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        ).returncode
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"{arm}: the sweep failed (exit {code}); its output is in {sweep_dir.parent / f'{arm}.out'}")
    folders = [sweep_dir]
    fleet_summary = None
    note = sweep_dir / "sweep_fleet.json"
    if note.is_file() and json.loads(note.read_text()).get("run_dir"):
        fleet_dir = Path(json.loads(note.read_text())["run_dir"])
        folders.append(fleet_dir)
        summary_file = fleet_dir / "fleet_summary.json"
        fleet_summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    logs = replica_logs(folders)
    texts = [log.read_text(errors="replace") for log in logs]
    outputs = [p.read_text(errors="replace") for p in [sweep_dir.parent / f"{arm}.out", *sweep_dir.glob("fleet_*.log")]]
    outputs += [p.read_text(errors="replace") for p in sweep_dir.glob("*/cli.log")]
    last_writes = {str(log): log.stat().st_mtime for log in logs}
    jobs = sorted((d for d in sweep_dir.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    metrics = [json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else {} for d in jobs]
    return {
        "wall_s": wall,
        "boots": boots(texts),
        "replica_s": replica_seconds(texts, [log.stat().st_mtime for log in logs], datetime.now().year),
        "replica_s_start": replica_seconds_from_start(process_starts(outputs), last_writes),
        "fleet_replica_s": (fleet_summary or {}).get("replica_seconds"),
        "rises": [rise(m) for m in metrics],
        "shares": [(m.get("shared_fleet") or {}).get("share_of_fleet") for m in metrics],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="trainer.max_steps of every point")
    parser.add_argument("--points", default="1,4,8,16", help="the lora.r values swept")
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--mode", choices=("sweep", "kill"), default="sweep")
    parser.add_argument("--kill-at", type=int, default=20, help="kill mode: B's step at which A's trainer is killed")
    parser.add_argument("--settle-s", type=float, default=2.0, help="kill mode: seconds after the kill left out")
    parser.add_argument("extra", nargs="*", help="more overrides for both arms (after --)")
    args = parser.parse_args()
    if args.mode == "kill":
        import shared_fleet_kill  # beside this script

        shared_fleet_kill.main(args)
        return
    points = args.points.split(",")
    base = Path(tempfile.mkdtemp(prefix="shared-fleet-bench-"))
    results = []
    for repeat in range(args.repeats):
        figures = {}
        order = tuple(reversed(ARMS)) if repeat % 2 == 0 else ARMS  # alternate; shared first: its failure shows soonest
        for arm in order:
            figures[arm] = one_arm(arm, base / f"{repeat}" / arm, args, repeat)
            f = figures[arm]
            rises = " ".join("-" if r is None else f"{r:+.2f}" for r in f["rises"])
            shares = " ".join("-" if s is None else f"{s:.0%}" for s in f["shares"])
            print(
                f"repeat {repeat + 1} {arm:10s} {f['wall_s']:5.0f} s, {f['boots']} boot(s), "
                f"{f['replica_s_start']:5.0f} replica-s ({f['replica_s']:.0f} from the first vLLM line), "
                f"reward rise per point {rises}" + (f", fleet shares {shares}" if arm == "shared" else ""),
                flush=True,
            )
        results.append(figures)
    (base / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n+recipe={args.recipe} lora.r={args.points} trainer.max_steps={args.steps} {' '.join(args.extra)}")
    print("\n".join(table(results, points)))
    print(f"(runs and results.json in {base})")


if __name__ == "__main__":
    main()
