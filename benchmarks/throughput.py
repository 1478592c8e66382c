"""TRL's sync and in-flight sizing against agrpo's defaults, same recipe and seed, side by side (prints figures;
asserts nothing).

    old  sync.mode=blocking + a fixed number of requests in flight (max_staleness x samples per step x replicas,
         queue twice that): TRL's pause -> save -> load -> resume at every sync, as agrpo ran before issue 18
    new  the defaults: sync.mode=background + trainer.max_inflight_tasks=auto

Topologies: `1` (one local replica), `2` (two local replicas behind the proxy), `straggler` (the same, replica 1 held
to a quarter of one core by a cgroup CPU quota; root only), `rehearsal` (two replica Jobs and a trainer Job
rehearsed on this machine, adapters through the stand-in bucket with a 1 s listing lag).

One command runs one repetition of one topology (old then new, or one of them with `--modes`) and writes its
figures to a JSON file; `table` prints the medians over every file of a folder, and the median of new / old taken
within each repetition (old and new of one repetition run back to back). The machine is shared, so run each command
on its own under the vLLM lock:

    for rep in 1 2 3; do for topo in 1 2 rehearsal; do for mode in old new; do
      flock /tmp/agrpo-vllm.lock python benchmarks/throughput.py run --topology $topo --modes $mode --tag $rep --out bench/
    done; done; done
    python benchmarks/throughput.py table bench/

Per run, from its own log history (the first WARMUP_STEPS steps excluded: they compile and warm the server):
steps/s, useful (trained) samples/s, % of generated samples dropped as stale, % of the step the trainer was blocked
by weight syncs (`perf/weight_sync_s`) and waited for rollouts (`perf/rollout_wait_s`), training time until the mean
reward of 5 consecutive steps first reaches 0.9, the mean reward of the last 5 steps, and the step time over the
trainer's own compute (forward+backward and optimizer: the floor a step could reach if nothing else cost time).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 2
REWARD_GOAL, REWARD_WINDOW = 0.9, 5
SMOKE_SAMPLES_PER_STEP, SMOKE_MAX_STALENESS = 16, 1  # recipes/smoke.yaml
STRAGGLER_SHARE = 0.25  # of one core, for replica 1 of the `straggler` topology
MODES = {"old": ("sync.mode=blocking",), "new": ()}
FIGURES = (
    ("steps_per_s", "steps/s", "{:.2f}"),
    ("useful_samples_per_s", "useful samples/s", "{:.1f}"),
    ("dropped_share", "% dropped", "{:.0%}"),
    ("sync_share", "% of step blocked by syncs", "{:.0%}"),
    ("wait_share", "% of step waiting for rollouts", "{:.0%}"),
    ("idle_share", "% of step the trainer idled (syncs + rollout wait)", "{:.0%}"),
    ("time_to_goal_s", f"s to a {REWARD_WINDOW}-step mean reward of {REWARD_GOAL}", "{:.0f}"),
    ("reward_last", "last-5 reward", "{:.3f}"),
    ("step_over_compute", "step time / trainer compute", "{:.1f}x"),
    ("replica1_share", "share of requests routed to replica 1", "{:.0%}"),
)


# ---- pure: figures of one run, and the table --------------------------------------------------------------------


def run_figures(history: list[dict]) -> dict[str, float | None]:
    """The benchmark's figures from one run's log history (TRL's logged steps)."""
    steps = [e for e in history if "perf/step_s" in e or "reward" in e]
    timed = [e for e in steps if e.get("perf/step_s") is not None][WARMUP_STEPS:]
    total = sum(e["perf/step_s"] for e in timed)

    def summed(key: str) -> float:
        return sum(float(e.get(key) or 0.0) for e in timed)

    used, dropped = summed("batch/samples_per_step"), summed("sample/dropped_stale_total")
    compute = summed("perf/fwd_bwd_s") + summed("perf/optimizer_s")
    rewards = [float(e["reward"]) for e in steps if e.get("reward") is not None]
    elapsed, time_to_goal = 0.0, None
    for index, entry in enumerate(steps):
        elapsed += float(entry.get("perf/step_s") or 0.0)
        window = rewards[max(0, index - REWARD_WINDOW + 1) : index + 1]
        if len(window) == REWARD_WINDOW and statistics.fmean(window) >= REWARD_GOAL:
            time_to_goal = elapsed
            break
    return {
        "steps": len(steps),
        "steps_per_s": len(timed) / total if total else None,
        "useful_samples_per_s": used / total if total else None,
        "dropped_share": dropped / (dropped + used) if dropped + used else None,
        "sync_share": summed("perf/weight_sync_s") / total if total else None,
        "wait_share": summed("perf/rollout_wait_s") / total if total else None,
        "idle_share": (summed("perf/weight_sync_s") + summed("perf/rollout_wait_s")) / total if total else None,
        "time_to_goal_s": time_to_goal,
        "reward_last": statistics.fmean(rewards[-REWARD_WINDOW:]) if rewards else None,
        "step_over_compute": total / compute if compute else None,
        "replica1_share": replica1_share(steps),
    }


def merged(results: list[dict]) -> list[dict]:
    """One result per (topology, repetition), joining old and new measured by separate commands."""
    joined: dict[tuple[str, str], dict] = {}
    for result in results:
        joined.setdefault((result["topology"], result["tag"]), {}).update(result)
    return list(joined.values())


def replica1_share(steps: list[dict]) -> float | None:
    """Share of the routed requests replica 1 took (behind the proxy; None with one replica)."""
    last = next((e for e in reversed(steps) if "proxy/replica1/routed" in e), None)
    if last is None or not last.get("proxy/routed"):
        return None
    return last["proxy/replica1/routed"] / (last["proxy/replica0/routed"] + last["proxy/replica1/routed"])


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def table(results: list[dict]) -> list[str]:
    """Markdown rows: per topology, the medians of the baseline (`main` where measured, else `old`) and new, and the
    median of new / baseline within each repetition."""
    base = "main" if any("main" in r for r in results) else "old"
    title = "main (the commit compared with)" if base == "main" else "old (TRL's behaviour)"
    lines = [
        f"| topology | figure | {title} | new (defaults) | new / {base}, same repetition |",
        "|---|---|---|---|---|",
    ]
    for topology in sorted({r["topology"] for r in results}):
        runs = [r for r in results if r["topology"] == topology]
        for key, label, spec in FIGURES:
            old = median([r[base].get(key) for r in runs if base in r])
            new = median([r["new"].get(key) for r in runs if "new" in r])
            ratios = [
                r["new"][key] / r[base][key]
                for r in runs
                if base in r and "new" in r and r[base].get(key) and r["new"].get(key) is not None
            ]
            ratio = f"{median(ratios):.2f}x" if ratios and key in ("steps_per_s", "useful_samples_per_s") else ""
            show = lambda v: "-" if v is None else spec.format(v)  # noqa: E731
            lines.append(f"| {topology} (n={len(runs)}) | {label} | {show(old)} | {show(new)} | {ratio} |")
    return lines


# ---- I/O: one run of the real CLI -------------------------------------------------------------------------------


def old_overrides(replicas: int) -> list[str]:
    """What agrpo ran before issue 18: TRL's blocking sync, requests in flight fixed at max_staleness x samples per
    step x replicas, the queue twice that."""
    inflight = max(SMOKE_MAX_STALENESS, 1) * SMOKE_SAMPLES_PER_STEP * replicas
    return [*MODES["old"], f"trainer.max_inflight_tasks={inflight}", f"trainer.queue_maxsize={2 * inflight}"]


def command(topology: str, mode: str, where: Path, seed: int, extra: list[str]) -> tuple[list[str], Path]:
    """The CLI command of one run, and the folder its log history lands in."""
    replicas = 1 if topology == "1" else 2  # "2", "straggler" (two local replicas) and "rehearsal" (two Jobs)
    overrides = old_overrides(replicas) if mode == "old" else list(MODES["new"])
    base = [sys.executable, "-m", "agrpo", "+recipe=smoke", f"trainer.seed={seed}", "trainer.save_steps=0"]
    if topology == "rehearsal":
        run_id = f"bench-{mode}"
        argv = base + [
            "launcher=hf_jobs",
            "sync=bucket",
            "inference.replicas=2",
            "inference.device=cpu",
            "--rehearse",
            f"launcher.hf_jobs.run_id={run_id}",
            f"--rehearsal-dir={where / 'rehearsal'}",
            "--rehearsal-listing-lag-s=1",
            "launcher.hf_jobs.poll_interval_s=2",
        ]
        return argv + overrides + extra, where / "rehearsal" / "buckets" / "rehearsal" / "agrpo-runs" / run_id
    argv = base + [f"inference.replicas={replicas}", f"hydra.run.dir={where / 'run'}"]
    return argv + overrides + extra, where / "run"


def launch(
    argv: list[str], where: Path, topology: str, run_dir: Path, code: Path = REPO
) -> subprocess.CompletedProcess:
    """Run the CLI of the checkout at `code` (another commit's worktree, for an A/B in one sitting); for
    `straggler`, hold replica 1 to a quarter of one core (a cgroup CPU quota on its process group,
    tests/cpu_quota.py) from the moment it is healthy to the end of the run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(code)}
    if topology != "straggler":
        return subprocess.run(argv, cwd=where, capture_output=True, text=True, env=env)
    from tests.cpu_quota import cpu_quota, process_group

    output = where / "launcher.out"
    with open(output, "wb") as sink:
        launcher = subprocess.Popen(argv, cwd=where, stdout=sink, stderr=subprocess.STDOUT, env=env)
    replica_log = run_dir / "logs" / "vllm-1.log"
    text = ""
    while "Application startup complete" not in text and launcher.poll() is None:
        time.sleep(0.5)
        text = replica_log.read_text(errors="replace") if replica_log.exists() else ""
    if launcher.poll() is None:
        pid = int(re.search(r"\(APIServer pid=(\d+)\)", text).group(1))
        with cpu_quota(process_group(os.getpgid(pid)), share=STRAGGLER_SHARE, name=f"bench-{os.getpid()}"):
            launcher.wait()
    return subprocess.CompletedProcess(argv, launcher.wait(), output.read_text(errors="replace"), "")


def run_once(topology: str, mode: str, seed: int, extra: list[str], keep: Path | None, code: Path = REPO) -> dict:
    where = Path(tempfile.mkdtemp(prefix=f"agrpo-bench-{topology}-{mode}-"))
    argv, run_dir = command(topology, "new" if mode == "main" else mode, where, seed, extra)
    started = time.monotonic()
    done = launch(argv, where, topology, run_dir, code if mode == "main" else REPO)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{topology}/{mode} failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    history = json.loads((run_dir / "log_history.json").read_text())
    figures = {**run_figures(history), "wall_s": wall, "command": " ".join(argv[1:])}
    if keep is not None:
        shutil.copytree(
            run_dir, keep / f"{topology}-{mode}", dirs_exist_ok=True, ignore=shutil.ignore_patterns(".vllm_lora")
        )
    shutil.rmtree(where, ignore_errors=True)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="one repetition of one topology: old then new")
    run.add_argument("--topology", choices=("1", "2", "straggler", "rehearsal"), required=True)
    run.add_argument(
        "--modes", default="old,new", help="comma-separated: old, new, main (new's settings, run from --main-code)"
    )
    run.add_argument("--main-code", type=Path, help="a worktree of the commit to compare with (mode `main`)")
    run.add_argument("--seed", type=int, default=42)
    run.add_argument("--out", type=Path, required=True, help="folder for the JSON result")
    run.add_argument("--tag", default="1", help="names the result file (the repetition)")
    run.add_argument("--keep-runs", action="store_true", help="keep each run's folder (logs, TensorBoard) in --out")
    run.add_argument("overrides", nargs="*", help="extra Hydra overrides for both modes")
    show = sub.add_parser("table", help="medians over every result in a folder")
    show.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.what == "table":
        print("\n".join(table(merged([json.loads(p.read_text()) for p in sorted(args.folder.glob("*.json"))]))))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"topology": args.topology, "seed": args.seed, "tag": args.tag}
    keep = args.out / f"{args.topology}-{args.tag}" if args.keep_runs else None
    for mode in args.modes.split(","):
        result[mode] = run_once(args.topology, mode, args.seed, list(args.overrides), keep, args.main_code or REPO)
        print(f"{args.topology}/{mode}: " + json.dumps({k: v for k, v in result[mode].items() if k != "command"}))
    (args.out / f"{args.topology}-{args.tag}-{'-'.join(args.modes.split(','))}.json").write_text(
        json.dumps(result, indent=2)
    )
    print("\n".join(table([result])))


if __name__ == "__main__":
    main()
