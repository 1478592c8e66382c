"""Time from the command to the first training step: the trainer started with the replicas, or once they are healthy.

    python benchmarks/trainer_start.py --repeats 3 [--recipe smoke] [-- extra overrides]

`launcher.trainer_during_boot=true` (the default) starts the trainer as the replicas start, so it imports TRL and
loads its model while they boot; `false` is agrpo's behaviour before, and TRL's own order (its trainer needs a
running server). Both arms run the same `python -m agrpo +recipe=...` command, alternating in one sitting (`late`,
then `early`, each repeat), and each repeat reads its seconds from the console: the launcher's start to `step 1/`
and to the end, plus the reward of the last 5 steps from metrics.json (a faster start must not change what is
learnt). Prints figures and the ratio of the medians; asserts nothing. Run it under the vLLM lock on a quiet machine.

With `-- role=trainer inference.urls=[URL] ...` both arms train against a server that is already running (CI does so
on its shared test replica: figures that say nothing about a start, only that the script runs); each run's
trl-policy-* adapters are then unloaded from it, so that the next run starts at v1 as on a fresh server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agrpo.inference.vllm_server import unload_adapters

ARMS = {"late": "launcher.trainer_during_boot=false", "early": "launcher.trainer_during_boot=true"}


def one_run(recipe: str, arm: str, extra: list[str]) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"trainer-start-{arm}-")) / "run"
    argv = [sys.executable, "-m", "agrpo", f"+recipe={recipe}", ARMS[arm], f"hydra.run.dir={run_dir}", *extra]
    started = time.monotonic()
    first_step = None
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if first_step is None and line.startswith("step ") and " 1/" in line.split("reward")[0]:
                first_step = time.monotonic() - started
        code = process.wait()
    total = time.monotonic() - started
    if code != 0 or first_step is None:
        raise SystemExit(f"{arm}: the run failed (exit {code}); its logs are in {run_dir}/logs")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"first_step_s": first_step, "total_s": total, "reward_last": metrics["reward_last"]}


def reused_servers(extra: list[str]) -> list[str]:
    """The URLs of `inference.urls=[...]` among the overrides (servers these runs do not start)."""
    urls = [item.split("=", 1)[1].strip("[]") for item in extra if item.startswith("inference.urls=")]
    return [url.strip() for value in urls for url in value.split(",") if url.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("extra", nargs="*", help="more overrides for both arms (after --)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS:
            figures = one_run(args.recipe, arm, args.extra)
            for url in reused_servers(args.extra):
                unload_adapters(url)
            results[arm].append(figures)
            print(
                f"repeat {repeat + 1} {arm:5s}  first step after {figures['first_step_s']:5.1f} s, "
                f"done after {figures['total_s']:5.1f} s, reward (last 5 steps) {figures['reward_last']:.3f}",
                flush=True,
            )
    medians = {arm: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for arm, runs in results.items()}
    print(f"\nmedians of {args.repeats}, +recipe={args.recipe} {' '.join(args.extra)}")
    print("| trainer starts | first step | whole run | reward (last 5 steps) |")
    print("|---|---|---|---|")
    for arm, label in (("late", "once the replicas are healthy"), ("early", "with the replicas (default)")):
        m = medians[arm]
        print(f"| {label} | {m['first_step_s']:.1f} s | {m['total_s']:.1f} s | {m['reward_last']:.3f} |")
    late, early = medians["late"], medians["early"]
    print(
        f"first step {late['first_step_s'] / early['first_step_s']:.2f}x sooner; "
        f"whole run {late['total_s'] / early['total_s']:.2f}x faster"
    )


if __name__ == "__main__":
    main()
