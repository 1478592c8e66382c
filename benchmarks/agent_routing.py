"""Multi-turn agent rollouts through N replicas: does every continuation turn reach the replica holding its prefix, and
does the prefix-cache hit rate stay where one replica puts it? A benchmark (prints figures; asserts nothing).

Runs the same agent recipe with the same seed twice, one after the other, the way a user runs it:
  1 replica    python -m agrpo +recipe=agent_smoke (no proxy)
  N replicas   python -m agrpo +recipe=agent_smoke inference.replicas=N (agrpo's proxy in front)
and prints, per run: the share of continuation turns served by the replica that served the episode's previous turn
(agent/continuation_affinity: same adapter version, replica named by the proxy), continuations that crossed to a
newer adapter version, the replicas' own prefix-cache hit rate (vLLM's counters, tokens), tool calls and turns per
episode, and the reward (first and last 5 steps, total and the environment's tool-use term). Goal: hit rate with N
replicas within 2 points of one replica. Start servers under the shared lock on a shared machine:

    flock /tmp/agrpo-vllm.lock python benchmarks/agent_routing.py [--replicas 2] [--seed 42] [key=value ...]

Smallest (CI, tests/benchmarks/test_benchmark_scripts_vllm.py): `--replicas 1 trainer.max_steps=2`, one run, one boot
(an agent recipe's prompts with their tool list do not fit the shared test replica's max_model_len of 256).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL_USE_TERM = "rewards/SecretWordEnv"  # the environment's reward: 1 when the episode called get_secret


def run(recipe: str, replicas: int, seed: int, run_dir: Path, overrides: list[str]) -> dict:
    argv = [sys.executable, "-m", "agrpo", f"+recipe={recipe}", f"inference.replicas={replicas}"]
    argv += [f"trainer.seed={seed}", f"hydra.run.dir={run_dir}", *overrides]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    history = json.loads((run_dir / "log_history.json").read_text())
    metrics["tool_use"] = [entry[TOOL_USE_TERM] for entry in history if TOOL_USE_TERM in entry]
    return metrics


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def row(label: str, metrics: dict) -> str:
    agent, serving = metrics.get("agent", {}), metrics.get("serving", {})
    tool_use = metrics["tool_use"]
    cells = [
        label,
        f"{agent.get('agent/continuation_affinity', float('nan')):.1%}"
        if "agent/continuation_affinity" in agent
        else "-",
        f"{int(agent.get('agent/continuations_routed', 0))} / {int(agent.get('agent/continuations_new_adapter', 0))}",
        f"{serving.get('serving/prefix_cache_hit_rate', float('nan')):.1%}",
        f"{agent.get('agent/tool_calls_per_episode', float('nan')):.2f}",
        f"{agent.get('agent/turns_per_episode', float('nan')):.2f}",
        f"{metrics.get('reward_first', float('nan')):.3f} -> {metrics.get('reward_last', float('nan')):.3f}",
        f"{mean(tool_use[:5]):.3f} -> {mean(tool_use[-5:]):.3f}",
        f"{metrics.get('wall_time_s', float('nan')):.0f} s",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="agent_smoke")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agent-routing-"))
    results = {}
    for replicas in sorted({1, args.replicas}):  # --replicas 1: the one-replica run alone (CI's smallest)
        print(f"running {args.recipe} with {replicas} replica(s), seed {args.seed} ...", flush=True)
        results[replicas] = run(args.recipe, replicas, args.seed, root / f"r{replicas}", args.overrides)
    print(
        "\n| replicas | continuations on the prefix's replica | routed / on a newer adapter | prefix-cache hit rate "
        "| tool calls / episode | turns / episode | reward first 5 -> last 5 | tool-use reward first 5 -> last 5 "
        "| wall time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for replicas, metrics in results.items():
        print(row(str(replicas), metrics))
    one, many = (results[r].get("serving", {}).get("serving/prefix_cache_hit_rate") for r in (1, args.replicas))
    if one is not None and many is not None and args.replicas > 1:
        print(f"\nhit rate, {args.replicas} replicas - 1 replica: {100 * (many - one):+.1f} points (goal: within 2)")
    print(f"runs kept in {root}")


if __name__ == "__main__":
    main()
