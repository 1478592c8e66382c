"""Issue 46's acceptance: "A tool answering 6 MB with the cap lifted costs at most its own episode: steps/s over the
next 10 steps within noise of the steps before." A benchmark: prints figures, asserts nothing.

The run: the own-tool task (benchmarks/own_tool_task: `units.py:convert`, the page's CPU recipe, its warm start) with
`agent.max_tool_output_chars=null`, one replica, the tiny model. The tool is the same converter with one difference:
once the benchmark has seen the console line of step `--at` (20), its next call answers the right number followed by
6,000,000 characters (6 MB), once. It is made the way tests/agents/test_refused_turns_vllm.py makes its 6 MB tool: a
plain string return, nothing agrpo-specific. Printed: when the 6 MB answer was made, the run's counters of cut answers
and refused turns, and, for the 10 steps before step `--at` and the 10 after, steps/s from the step lines' arrival
(wall) and from the trainer's own step times (perf/step_s), and the reward.

    flock /tmp/agrpo-dev-vllm.lock env PYTHONPATH=. python benchmarks/agent_huge_tool.py [--at 20] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = Path(__file__).resolve().parent / "own_tool_task"
WINDOW = 10
HUGE_CHARS = 6_000_000

# units.py's converter, the answer 6 MB longer once the benchmark drops HUGE_NOW beside this file.
HUGE_TOOL = '''
import os
import time
from pathlib import Path

_plain_convert = convert
_NOW = Path(__file__).with_name("HUGE_NOW")


def convert(amount: int, unit: str) -> str:
    """Convert an amount of a unit into zorbs.

    Args:
        amount: How many of the unit.
        unit: The unit to convert from.

    Returns:
        The amount in zorbs.
    """
    answer = _plain_convert(amount, unit)
    try:
        os.rename(_NOW, _NOW.with_name("HUGE_CLAIMED"))  # one caller wins, once
    except OSError:
        return answer
    _NOW.with_name("HUGE_SENT").write_text(str(time.time()))
    return answer + " " + "z" * HUGE_CHARS
'''


def task_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="agrpo-huge-tool-"))
    for name in ("units.py", "make_data.py", "own_tool.yaml"):
        shutil.copy(TASK / name, folder / name)
    tool = (TASK / "units.py").read_text() + f"\nHUGE_CHARS = {HUGE_CHARS}\n" + HUGE_TOOL
    (folder / "huge_units.py").write_text(tool)
    recipe = (folder / "own_tool.yaml").read_text().replace("    - units.py:convert", "    - huge_units.py:convert")
    (folder / "huge_tool.yaml").write_text(recipe.replace("run_name: own_tool", "run_name: huge_tool"))
    subprocess.run([sys.executable, "make_data.py", "."], cwd=folder, check=True, capture_output=True)
    return folder


def run(folder: Path, at: int, steps: int, overrides: list[str]) -> tuple[dict[int, float], float, list[str]]:
    """Run the recipe, drop HUGE_NOW on step `at`'s console line; ({step: when its line arrived}, when the line of
    step `at` arrived, the output's lines)."""
    argv = [sys.executable, "-m", "agrpo", "+recipe=huge_tool.yaml", f"trainer.max_steps={steps}"]
    argv += ["agent.max_tool_output_chars=null", "logger.console_every=1", f"hydra.run.dir={folder / 'run'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    seen: dict[int, float] = {}
    lines: list[str] = []
    dropped_at = float("nan")
    with subprocess.Popen(
        [*argv, *overrides], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            step = re.match(r"step\s+(\d+)/\d+ ", line)
            if step and int(step.group(1)) not in seen:
                seen[int(step.group(1))] = time.time()
                if int(step.group(1)) == at:
                    (folder / "HUGE_NOW").write_text("")
                    dropped_at = seen[at]
        code = proc.wait()
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}:\n" + "\n".join(lines[-60:]))
    return seen, dropped_at, lines


def window(history: list[dict], first: int, last: int, key: str) -> list[float]:
    return [float(e[key]) for e in history if first <= e.get("step", -1) <= last and e.get(key) is not None]


def report(folder: Path, at: int, seen: dict[int, float], dropped_at: float, lines: list[str]) -> None:
    history = [e for e in json.loads((folder / "run" / "log_history.json").read_text()) if "train_runtime" not in e]
    sent = folder / "HUGE_SENT"
    made = float(sent.read_text()) if sent.is_file() else None
    made_step = max((s for s, t in seen.items() if made is not None and t <= made), default=None)
    if made is None:
        print("6 MB answer: never made (no call after the drop)")
    else:
        print(f"6 MB answer: made {made - dropped_at:.1f} s after step {at}'s line, after step {made_step}'s line")
    for key in (
        "tools/truncated_total",
        "rollout/context_full_total",
        "rollout/refused_turns_total",
        "rollout/vllm_retry_total",
    ):
        print(f"  {key}: {sum(window(history, 0, 10**9, key)):.0f}")
    for line in lines:
        if line.startswith("agrpo:") and ("max_model_len" in line or "max_tool_output_chars" in line):
            print(f"  console: {line[:300]}")
    for name, first, last in (("before", at - WINDOW + 1, at), ("after", at + 1, at + WINDOW)):
        wall = (seen[last] - seen[first - 1]) if first - 1 in seen and last in seen else None
        step_s = window(history, first, last, "perf/step_s")
        rewards = window(history, first, last, "reward")
        print(
            f"  steps {first}-{last} ({name}): "
            + (f"{WINDOW / wall:.2f} steps/s by the step lines ({wall:.1f} s)" if wall else "wall -")
            + (f", {len(step_s) / sum(step_s):.2f} steps/s by perf/step_s" if step_s and sum(step_s) else "")
            + (f", reward {sum(rewards) / len(rewards):.3f}" if rewards else "")
            + (f", slowest step {max(step_s):.2f} s" if step_s else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", type=int, default=20, help="the step after whose line the tool answers 6 MB once")
    parser.add_argument("--keep", action="store_true", help="keep the task folder (printed)")
    args, overrides = parser.parse_known_args()
    folder = task_folder()
    start = time.monotonic()
    seen, dropped_at, lines = run(folder, args.at, args.at + WINDOW + 2, overrides)
    print(
        f"agent_huge_tool: own tool task, cap lifted, 6 MB once after step {args.at}; {time.monotonic() - start:.0f} s"
    )
    report(folder, args.at, seen, dropped_at, lines)
    print("\n".join(f"  {line}" for line in lines if line.startswith("agrpo: done")))
    if args.keep:
        print(f"  task folder: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
