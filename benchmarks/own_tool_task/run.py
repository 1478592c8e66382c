"""docs/your_agent.md's section 4 example, `units.py:convert`, trained with the page's CPU recipe ("On a CPU: a recipe
that learns"): what the page shows, measured. A benchmark: prints figures, asserts nothing. The acceptance's task in
no doc is the test suite's (tests/e2e/test_tool_task_from_docs.py); this one is the page's own example.

The task: `units.py:convert` turns an amount of a made-up unit into zorbs with factors only that file knows, so the
answer cannot be guessed; 120 JSONL rows (make_data.py); the reward is numeric_match on the final answer. The tiny
model never writes a tool call, so the recipe (own_tool.yaml) turns on `agent.warmstart` with the rows' `amount` and
`unit` as the call's arguments. Printed: the warm start's time (0 when cached), then tool calls per episode and the
reward, mean of the first 5 and of the last 5 steps, and the wall time. Start it under the shared lock:

    flock /tmp/agrpo-vllm.lock python benchmarks/own_tool_task/run.py [--steps 60] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def figures(history: list[dict], key: str) -> tuple[float, float]:
    values = [float(e[key]) for e in history if key in e and "train_runtime" not in e]
    return mean(values[:5]), mean(values[-5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--keep", action="store_true", help="keep the task folder (printed)")
    args, overrides = parser.parse_known_args()
    folder = Path(tempfile.mkdtemp(prefix="agrpo-own-tool-"))
    for name in ("units.py", "make_data.py", "own_tool.yaml"):
        shutil.copy(HERE / name, folder / name)
    subprocess.run([sys.executable, "make_data.py", "."], cwd=folder, check=True, capture_output=True)
    run_dir = folder / "run"
    argv = [sys.executable, "-m", "agrpo", "+recipe=own_tool.yaml", f"trainer.max_steps={args.steps}"]
    argv += [f"hydra.run.dir={run_dir}", *overrides]
    start = time.monotonic()
    result = subprocess.run(argv, cwd=folder, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    history = json.loads((run_dir / "log_history.json").read_text())
    calls, reward = figures(history, "tools/call_frequency"), figures(history, "reward")
    print(f"own tool task, {args.steps} steps, tiny model with agent.warmstart: wall time {wall:.0f} s")
    print(f"  tool calls per episode, first 5 steps -> last 5: {calls[0]:.2f} -> {calls[1]:.2f}")
    print(f"  reward (numeric_match), first 5 steps -> last 5: {reward[0]:.3f} -> {reward[1]:.3f}")
    print("  " + "\n  ".join(line for line in result.stderr.splitlines() if line.startswith("agrpo: done")))
    if args.keep:
        print(f"  task folder: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
