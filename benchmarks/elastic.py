"""A fleet that sizes itself against fixed fleets, same recipe and seed, one sitting (prints figures; asserts nothing).

    fixed-min  inference.replicas=1
    fixed-max  inference.replicas=2
    auto       inference.replicas=auto inference.min_replicas=1 inference.max_replicas=2

On the smoke recipe with `trainer.max_staleness=2` (room for the in-flight controller) and, with `--straggler`, the
first replica held to a quarter of one core once training starts (a cgroup CPU quota on its process group,
tests/cpu_quota.py; root only), so that one replica cannot keep up and a second one can help. One command runs one
repetition of the modes it is given, one after another, and writes a JSON file; `table` prints the medians over a
folder. The machine is shared: run under the vLLM lock.

    for rep in 1 2 3; do
      flock /tmp/agrpo-vllm.lock python benchmarks/elastic.py run --straggler --tag $rep --out bench-elastic/
    done
    python benchmarks/elastic.py table bench-elastic/

`--long` gives each step 64 samples of up to 48 tokens (the smoke recipe: 16 of 16) for 200 steps, so that the
target takes minutes of training rather than less than one replica's boot (docs/elastic.md, 2026-12-06).

`--release SHARE` (auto only, with `--straggler`) adds a second phase to show a release: once the addition was kept,
the straggler's quota is lifted and the trainer's own process (not its rollout and reward children) is held to SHARE
of a core instead (0.1: docs/elastic.md), so the replicas idle and the fleet should give one back. The run's fleet
lines are kept in the result (`fleet_lines`).

Per run: wall time of the whole command; the time until the 5-step mean reward first reaches 0.9, both in training
time (benchmarks/throughput.py's figure, from step 1) and from the command (what the user waits: the boot until step
1, where a fixed 2-replica fleet boots both its replicas, then the training time); replica-seconds (each replica's
life, from the first line of its log to its last write: booting replicas cost too; a spare's wait as a standby,
holding no device, does not); $ per 1,000 trained samples at
`--price` $/replica-hour; the share of each step the trainer waited for rollouts (its idle share); the last-5 reward.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import REPO, run_figures  # noqa: E402 - the sibling benchmark's figures of one run

MODES = {
    "fixed-min": ("inference.replicas=1",),
    "fixed-max": ("inference.replicas=2",),
    "auto": ("inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2"),
}
COMMON = ("+recipe=smoke", "trainer.max_staleness=2", "trainer.max_steps=100", "trainer.save_steps=0")
# --long: 64 samples of up to 48 tokens a step (the smoke recipe: 16 of 16), 200 steps. The smoke task reaches the
# target 11-17 s into training, less than one replica's boot; this one takes ~2 minutes on two replicas, so that a boot
# is closer to the share of a run it is on a GPU (a 1-2 minute boot in an hours-long run). A lower learning rate does
# not lengthen the task (2e-4 to 5e-3: the target after 70-100 steps either way; docs/elastic.md).
LONG = ("trainer.max_completion_length=48", "trainer.per_device_train_batch_size=64", "trainer.max_steps=200")
STRAGGLER_SHARE = 0.25
LOG_TIME = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
FIGURES = (
    ("wall_s", "wall s", "{:.0f}"),
    ("time_to_goal_s", "s to a 5-step mean reward of 0.9 (training time)", "{:.0f}"),
    ("launch_to_goal_s", "s from the command to that reward", "{:.0f}"),
    ("first_step_s", "s from the command to step 1", "{:.0f}"),
    ("replica_seconds", "replica-seconds", "{:.0f}"),
    ("usd_per_1k", "$ per 1,000 samples", "{:.3f}"),
    ("wait_share", "trainer idle (waits for rollouts)", "{:.0%}"),
    ("reward_last", "last-5 reward", "{:.3f}"),
)


# ---- pure ---------------------------------------------------------------------------------------------------------


def replica_seconds(log_texts: list[str], last_writes: list[float], year: int) -> float:
    """Sum of each replica's serving lives: from a life's first timestamp (vLLM writes `MM-DD HH:MM:SS`) to its last
    one, the last life to the log's last write. A spare standing by (inference.fleet.standby) writes no timestamp
    before it is added, and a life ends where the next standby begins ("holding no device"): a standby holds no
    device and costs nothing, as the fleet controller counts it."""
    total = 0.0
    for text, last_write in zip(log_texts, last_writes):
        lives: list[list[float]] = [[]]
        for line in text.splitlines():
            if "agrpo standby:" in line and "holding no device" in line and lives[-1]:
                lives.append([])
            found = LOG_TIME.search(line)
            if found:
                lives[-1].append(datetime.strptime(f"{year}-{found[1]}", "%Y-%m-%d %H:%M:%S").timestamp())
        *over, current = lives  # the earlier lives ended at their last line; one still going, at the last write
        total += sum(life[-1] - life[0] for life in over if life)
        if current:
            total += max(0.0, last_write - current[0])
    return total


def table(results: list[dict]) -> list[str]:
    """Markdown rows: each figure's median per mode, and auto against the faster fixed fleet."""
    modes = [m for m in MODES if any(m in r for r in results)]
    lines = [f"| figure | {' | '.join(modes)} |", "|---|" + "---|" * len(modes)]
    for key, label, spec in FIGURES:
        cells = []
        for mode in modes:
            values = [r[mode][key] for r in results if mode in r and r[mode].get(key) is not None]
            cells.append(spec.format(statistics.median(values)) if values else "-")
        lines.append(f"| {label} (n={len(results)}) | {' | '.join(cells)} |")
    return lines


# ---- I/O: one run of the real CLI ---------------------------------------------------------------------------------


def launch(argv: list[str], where: Path, run_dir: Path, straggler: bool, release: float = 0.0) -> tuple[int, float]:
    """Run the CLI; (its exit code, seconds from the launch to the first step's line: the boot the user waits for).
    `release`: once the addition was kept, hold the trainer's own process to this share of a core instead."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    with open(where / "launcher.out", "wb") as sink:
        launcher = subprocess.Popen(argv, cwd=where, stdout=sink, stderr=subprocess.STDOUT, env=env)
    trainer_log = run_dir / "logs" / "trainer.log"
    while not (trainer_log.exists() and re.search(r"step +1/", trainer_log.read_text(errors="replace"))):
        if launcher.poll() is not None:  # ended before training: the caller reports its output
            return launcher.returncode, 0.0
        time.sleep(0.5)
    first_step = time.monotonic() - started
    if not straggler:
        return launcher.wait(), first_step
    sys.path.insert(0, str(REPO))  # the suite's cgroup helper: tests/ is not installed
    from tests.cpu_quota import cpu_quota, process_group
    from tests.processes import trainer_pids

    pid = int(re.search(r"\(APIServer pid=(\d+)\)", (run_dir / "logs" / "vllm-0.log").read_text()).group(1))
    with cpu_quota(process_group(os.getpgid(pid)), share=STRAGGLER_SHARE, name=f"bench-elastic-{os.getpid()}"):
        if not release:
            return launcher.wait(), first_step
        while "kept the add" not in (where / "launcher.out").read_text(errors="replace"):
            if launcher.poll() is not None:
                return launcher.returncode, first_step
            time.sleep(0.5)
    # the replicas are free now and the trainer is the slow part: the fleet should release one. The trainer's own
    # process only, not its process group: that holds the rollout child and the reward child too, and holding them
    # slows generation with the trainer (measured so: the trainer still waited 0.2-0.4 s of each 0.5-0.9 s step)
    with cpu_quota(trainer_pids(run_dir), share=release, name=f"bench-trainer-{os.getpid()}"):
        return launcher.wait(), first_step


def from_launch(first_step_s: float, history: list[dict], time_to_goal_s: float | None) -> float | None:
    """Seconds from the command to the target: the boot until step 1's line, then the training time after step 1
    (run_figures counts the target's time from step 1's start; fixed-max boots both its replicas before step 1)."""
    if time_to_goal_s is None:
        return None
    first = next((float(e.get("perf/step_s") or 0.0) for e in history if "perf/step_s" in e), 0.0)
    return first_step_s + time_to_goal_s - first


def plot_history(history: list[dict], png: Path) -> None:
    """docs/elastic.md's picture: the fleet's size beside reward and step time, per step, from one auto run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e for e in history if "reward" in e and "step" in e]
    panels = (("reward", "reward"), ("perf/step_s", "step time (s)"), ("fleet/replicas", "replicas"))
    figure, axes = plt.subplots(len(panels), 1, figsize=(7, 6), sharex=True)
    for axis, (key, label) in zip(axes, panels):
        points = [(e["step"], e[key]) for e in steps if e.get(key) is not None]
        axis.plot([p[0] for p in points], [p[1] for p in points], drawstyle="steps-post" if "fleet" in key else None)
        axis.set_ylabel(label)
    axes[-1].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(png, dpi=80)


def common(long: bool) -> list[str]:
    """The overrides every mode shares: the smoke recipe's, or with --long its heavier steps (one value per key)."""
    chosen = {item.split("=")[0]: item for item in COMMON + (LONG if long else ())}
    return list(chosen.values())


def run_once(
    mode: str, seed: int, straggler: bool, price: float, base: list[str], keep: Path, release: float = 0.0
) -> dict:
    """`base`: common(), then the user's extra overrides."""
    where = Path(tempfile.mkdtemp(prefix=f"agrpo-bench-elastic-{mode}-"))
    run_dir = where / "run"
    argv = [sys.executable, "-m", "agrpo", *base, *MODES[mode], f"trainer.seed={seed}", f"hydra.run.dir={run_dir}"]
    started = time.monotonic()
    code, first_step_s = launch(argv, where, run_dir, straggler, release)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"{mode} failed (rc {code}):\n{(where / 'launcher.out').read_text()[-4000:]}")
    history = json.loads((run_dir / "log_history.json").read_text())
    logs = sorted((run_dir / "logs").glob("vllm-*.log"))
    seconds = replica_seconds(
        [log.read_text(errors="replace") for log in logs],
        [log.stat().st_mtime for log in logs],
        datetime.now().year,
    )
    samples = sum(float(e.get("batch/samples_per_step") or 0.0) for e in history)
    figures = run_figures(history)
    console = (where / "launcher.out").read_text(errors="replace")
    fleet_lines = [line for line in console.splitlines() if line.startswith("agrpo fleet")]
    shutil.copy(run_dir / "log_history.json", keep.with_name(f"{keep.name}-{mode}-history.json"))
    shutil.rmtree(where, ignore_errors=True)
    return {
        **{key: figures.get(key) for key in ("time_to_goal_s", "wait_share", "reward_last", "steps_per_s")},
        "wall_s": wall,
        "first_step_s": first_step_s,
        "launch_to_goal_s": from_launch(first_step_s, history, figures.get("time_to_goal_s")),
        "replica_seconds": seconds,
        "replicas_started": len(logs),
        "usd_per_1k": seconds * price / 3600 / samples * 1000 if samples else None,
        "command": " ".join(argv[1:]),
        "fleet_lines": fleet_lines,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="one repetition: each mode, one after another")
    run.add_argument("--modes", default="fixed-min,fixed-max,auto")
    run.add_argument("--straggler", action="store_true", help="hold the first replica to a quarter of one core")
    run.add_argument("--price", type=float, default=5.0, help="$ per replica-hour (5.00: an h200 Job)")
    run.add_argument(
        "--release", type=float, default=0.0, metavar="SHARE", help="auto: then hold the trainer to SHARE of a core"
    )
    run.add_argument("--long", action="store_true", help="heavier steps, ~2 minutes to the target (LONG)")
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--tag", default="1")
    run.add_argument("overrides", nargs="*", help="extra Hydra overrides for every mode")
    show = sub.add_parser("table", help="medians over every result in a folder")
    show.add_argument("folder", type=Path)
    picture = sub.add_parser("plot", help="fleet size, reward and step time of one kept run's history")
    picture.add_argument("history", type=Path)
    picture.add_argument("png", type=Path)
    args = parser.parse_args(argv)
    if args.what == "plot":
        plot_history(json.loads(args.history.read_text()), args.png)
        return
    if args.what == "table":
        runs = [p for p in sorted(args.folder.glob("elastic-*.json")) if not p.name.endswith("-history.json")]
        print("\n".join(table([json.loads(p.read_text()) for p in runs])))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"seed": args.seed, "tag": args.tag, "straggler": args.straggler, "long": args.long}
    base = common(args.long) + list(args.overrides)
    for mode in args.modes.split(","):
        keep = args.out / f"elastic-{args.tag}"
        release = args.release if mode == "auto" else 0.0
        result[mode] = run_once(mode, args.seed, args.straggler, args.price, base, keep, release)
        shown = {k: v for k, v in result[mode].items() if k not in ("command", "fleet_lines")}
        print(f"{mode}: " + json.dumps(shown), flush=True)
        print("\n".join(f"  {line}" for line in result[mode]["fleet_lines"]), flush=True)
    (args.out / f"elastic-{args.tag}.json").write_text(json.dumps(result, indent=2))
    print("\n".join(table([result])))


if __name__ == "__main__":
    main()
