"""docs/your_agent.md's section 4 example, `units.py:convert`, trained with the page's CPU recipe ("On a CPU: a recipe
that learns"): what the page shows, measured. A benchmark: prints figures, asserts nothing. The acceptance's task in
no doc is the test suite's (tests/e2e/test_tool_task_from_docs.py); this one is the page's own example.

The task: `units.py:convert` turns an amount of a made-up unit into zorbs with factors only that file knows, so the
answer cannot be guessed; 120 JSONL rows (make_data.py); the reward is numeric_match on the final answer. The tiny
model never writes a tool call, so the recipe (own_tool.yaml) turns on `agent.warmstart` with the rows' `amount` and
`unit` as the call's arguments. Printed: the warm start's time (0 when cached), then tool calls per episode and the
reward, mean of the first 5 and of the last 5 steps, and the wall time; the reward's best and last 10-step means; and,
per 10 steps, the replies whose tool call TRL could not parse against every reply that opened one, with their reasons
(agrpo/agents/malformed.py; sample_calls.py shows them as the model wrote them). Start it under the shared lock:

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

from agrpo.agents.malformed import REASONS, reason_key
from agrpo.agents.metrics import MALFORMED

HERE = Path(__file__).resolve().parent


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def figures(history: list[dict], key: str) -> tuple[float, float]:
    values = [float(e[key]) for e in history if key in e and "train_runtime" not in e]
    return mean(values[:5]), mean(values[-5:])


def window_means(values: list[float], width: int = 10) -> list[float]:
    return [mean(values[i : i + width]) for i in range(len(values) - width + 1)]


def unparseable_windows(history: list[dict], width: int = 10) -> list[str]:
    """Per `width` steps: `unparseable/opened (share; reason n, ...)`, where opened counts every reply that opened a
    tool call (the parsed calls, tools/<name>/call_total, and the unparseable ones)."""
    steps = [e for e in history if "reward" in e and "train_runtime" not in e]
    cells = []
    for start in range(0, len(steps), width):
        window = steps[start : start + width]
        bad = sum(e.get(MALFORMED, 0.0) for e in window)
        calls = sum(v for e in window for k, v in e.items() if k.startswith("tools/") and k.endswith("/call_total"))
        reasons = {r: sum(e.get(reason_key(r), 0.0) for e in window) for r in REASONS}
        named = ", ".join(f"{r} {n:.0f}" for r, n in reasons.items() if n)
        cells.append(f"{bad:.0f}/{bad + calls:.0f} ({bad / max(1.0, bad + calls):.0%}{'; ' + named if named else ''})")
    return cells


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
    rewards = [float(e["reward"]) for e in history if "reward" in e and "train_runtime" not in e]
    means = window_means(rewards) or [float("nan")]
    print(f"  reward, best 10-step mean {max(means):.3f}, last 10 steps {means[-1]:.3f}")
    print("  unparseable tool calls / replies opening one, per 10 steps: " + " | ".join(unparseable_windows(history)))
    print("  " + "\n  ".join(line for line in result.stderr.splitlines() if line.startswith("agrpo: done")))
    if args.keep:
        print(f"  task folder: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
