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

`--release` (auto only, with `--straggler`) adds a second phase to show a release: once the addition was kept, the
straggler's quota is lifted and the trainer is held to a quarter core instead, so the replicas idle and the fleet
should give one back. The run's fleet lines are kept in the result (`fleet_lines`).

Per run: wall time of the whole command, training time until the 5-step mean reward first reaches 0.9
(benchmarks/throughput.py's figure), replica-seconds (each replica's life, from the first line of its log to its
last write: booting replicas cost too), $ per 1,000 trained samples at `--price` $/replica-hour, the share of each
step the trainer waited for rollouts (its idle share), and the last-5 reward.
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
STRAGGLER_SHARE = 0.25
LOG_TIME = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
FIGURES = (
    ("wall_s", "wall s", "{:.0f}"),
    ("time_to_goal_s", "s to a 5-step mean reward of 0.9", "{:.0f}"),
    ("replica_seconds", "replica-seconds", "{:.0f}"),
    ("usd_per_1k", "$ per 1,000 samples", "{:.3f}"),
    ("wait_share", "trainer idle (waits for rollouts)", "{:.0%}"),
    ("reward_last", "last-5 reward", "{:.3f}"),
)


# ---- pure ---------------------------------------------------------------------------------------------------------


def replica_seconds(first_lines: list[str], last_writes: list[float], year: int) -> float:
    """Sum of each replica's life: its log's first timestamp (vLLM writes `MM-DD HH:MM:SS`) to its last write."""
    total = 0.0
    for line, last in zip(first_lines, last_writes):
        found = LOG_TIME.search(line)
        if found:
            started = datetime.strptime(f"{year}-{found[1]}", "%Y-%m-%d %H:%M:%S").timestamp()
            total += max(0.0, last - started)
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


def trainer_group(run_dir: Path) -> int:
    """The trainer's process group (the launcher starts it in its own session), found by its config path."""
    config = str(run_dir / "config.yaml")
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agrpo.trainer" in argv and config.encode() in argv:
            return os.getpgid(int(entry.name))
    raise RuntimeError(f"no trainer process with {config}")


def launch(argv: list[str], where: Path, run_dir: Path, straggler: bool, release: bool = False) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    with open(where / "launcher.out", "wb") as sink:
        launcher = subprocess.Popen(argv, cwd=where, stdout=sink, stderr=subprocess.STDOUT, env=env)
    if not straggler:
        return launcher.wait()
    sys.path.insert(0, str(REPO))  # the suite's cgroup helper: tests/ is not installed
    from tests.cpu_quota import cpu_quota, process_group

    trainer_log = run_dir / "logs" / "trainer.log"
    while not (trainer_log.exists() and re.search(r"step +1/", trainer_log.read_text(errors="replace"))):
        if launcher.poll() is not None:  # ended before training: the caller reports its output
            return launcher.returncode
        time.sleep(0.5)
    pid = int(re.search(r"\(APIServer pid=(\d+)\)", (run_dir / "logs" / "vllm-0.log").read_text()).group(1))
    with cpu_quota(process_group(os.getpgid(pid)), share=STRAGGLER_SHARE, name=f"bench-elastic-{os.getpid()}"):
        if not release:
            return launcher.wait()
        while "kept the add" not in (where / "launcher.out").read_text(errors="replace"):
            if launcher.poll() is not None:
                return launcher.returncode
            time.sleep(0.5)
    # the replicas are free now and the trainer is the slow part: the fleet should release one
    with cpu_quota(process_group(trainer_group(run_dir)), share=STRAGGLER_SHARE, name=f"bench-trainer-{os.getpid()}"):
        return launcher.wait()


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


def run_once(
    mode: str, seed: int, straggler: bool, price: float, extra: list[str], keep: Path, release: bool = False
) -> dict:
    where = Path(tempfile.mkdtemp(prefix=f"agrpo-bench-elastic-{mode}-"))
    run_dir = where / "run"
    argv = [sys.executable, "-m", "agrpo", *COMMON, *MODES[mode], f"trainer.seed={seed}", f"hydra.run.dir={run_dir}"]
    started = time.monotonic()
    code = launch(argv + extra, where, run_dir, straggler, release)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"{mode} failed (rc {code}):\n{(where / 'launcher.out').read_text()[-4000:]}")
    history = json.loads((run_dir / "log_history.json").read_text())
    logs = sorted((run_dir / "logs").glob("vllm-*.log"))
    seconds = replica_seconds(
        [next((line for line in log.open(errors="replace") if LOG_TIME.search(line)), "") for log in logs],
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
        "replica_seconds": seconds,
        "replicas_started": len(logs),
        "usd_per_1k": seconds * price / 3600 / samples * 1000 if samples else None,
        "command": " ".join(argv[1:] + extra),
        "fleet_lines": fleet_lines,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="one repetition: each mode, one after another")
    run.add_argument("--modes", default="fixed-min,fixed-max,auto")
    run.add_argument("--straggler", action="store_true", help="hold the first replica to a quarter of one core")
    run.add_argument("--price", type=float, default=5.0, help="$ per replica-hour (5.00: an h200 Job)")
    run.add_argument("--release", action="store_true", help="auto: then hold the trainer instead (docstring)")
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
    result: dict = {"seed": args.seed, "tag": args.tag, "straggler": args.straggler}
    for mode in args.modes.split(","):
        keep = args.out / f"elastic-{args.tag}"
        release = args.release and mode == "auto"
        result[mode] = run_once(mode, args.seed, args.straggler, args.price, list(args.overrides), keep, release)
        shown = {k: v for k, v in result[mode].items() if k not in ("command", "fleet_lines")}
        print(f"{mode}: " + json.dumps(shown), flush=True)
        print("\n".join(f"  {line}" for line in result[mode]["fleet_lines"]), flush=True)
    (args.out / f"elastic-{args.tag}.json").write_text(json.dumps(result, indent=2))
    print("\n".join(table([result])))


if __name__ == "__main__":
    main()
