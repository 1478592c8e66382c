"""`agrpo plot RUN_DIR [RUN_DIR...] [-o out.png]`: a picture of one or more runs (reward, KL, completion length, step
time over steps), from each run's `<run_dir>/log_history.json` (written by the trainer), runs overlaid with a legend.

Readable without TensorBoard, small enough for a model card or an issue. `plot_run_dir` writes
`<run_dir>/training_curves.png` at the end of a run. Drawing uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

LOG_HISTORY_FILE = "log_history.json"  # as agrpo.trainer.trl_backend.LOG_HISTORY_FILE (that module imports TRL)
CURVES_PNG = "training_curves.png"

# (panel title, TRL's metric, y label). The reward band is mean +- std over each step's samples.
PANELS = [
    ("reward", "reward", "mean reward (band: ± std)"),
    ("KL, trained vs sampling policy", "kl", "kl"),
    ("completion length", "completions/mean_length", "tokens"),
    ("step time", "perf/step_s", "seconds"),
]


class PlotError(Exception):
    """A run directory without a readable log history (the CLI prints it as one line)."""


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / LOG_HISTORY_FILE
    try:
        history = json.loads(path.read_text())
    except OSError:
        raise PlotError(f"{path} does not exist: is {run_dir} a finished agrpo run directory?") from None
    except ValueError as error:
        raise PlotError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(history, list):
        raise PlotError(f"{path} holds no list of logged steps")
    return history


def series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over a run; entries without it (or with None/NaN) are skipped."""
    steps, values = [], []
    for index, entry in enumerate(history, start=1):
        value = entry.get(key)
        if value is None or "train_runtime" in entry:
            continue
        value = float(value)
        if math.isnan(value):
            continue
        steps.append(int(entry.get("step", index)))
        values.append(value)
    return steps, values


def run_label(run_dir: str | Path, all_dirs: list[Path]) -> str:
    """The shortest tail of the path that tells the runs apart (e.g. smoke/2026-12-01_03-41-14)."""
    parts = Path(run_dir).resolve().parts
    for depth in range(1, len(parts) + 1):
        tails = {Path(*Path(d).resolve().parts[-depth:]) for d in all_dirs}
        if len(tails) == len(all_dirs):
            return str(Path(*parts[-depth:]))
    return str(run_dir)


def plot_histories(runs: list[tuple[str, list[dict[str, Any]]]], out_png: str | Path, title: str | None = None) -> Path:
    """Draw the four panels for each (label, history), overlaid; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for (panel, key, ylabel), ax in zip(PANELS, axes.flat):
        for index, (label, history) in enumerate(runs):
            color = f"C{index % 10}"
            steps, values = series(history, key)
            if not steps:
                continue
            ax.plot(steps, values, color=color, linewidth=1.4, label=label)
            if key == "reward":
                std_steps, stds = series(history, "reward_std")
                if std_steps == steps:
                    ax.fill_between(
                        steps,
                        [v - s for v, s in zip(values, stds)],
                        [v + s for v, s in zip(values, stds)],
                        color=color,
                        alpha=0.15,
                        linewidth=0,
                    )
        ax.set_title(panel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if not handles:  # no rewards logged: take the legend from any panel that has lines
        for ax in axes.flat:
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                break
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=9, frameon=False)
    fig.suptitle(title or ("agrpo run" if len(runs) == 1 else f"agrpo: {len(runs)} runs"))
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(labels) - 1) // 3 if handles else 0), 1, 1))
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_runs(
    run_dirs: list[str | Path], out_png: str | Path, labels: list[str] | None = None, title: str | None = None
) -> Path:
    """Overlay the runs in `run_dirs` into one PNG (labels: the shortest distinguishing path tails)."""
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise PlotError("no run directory given")
    names = labels or [run_label(d, dirs) for d in dirs]
    return plot_histories([(name, read_history(d)) for name, d in zip(names, dirs)], out_png, title)


def plot_run_dir(run_dir: str | Path) -> Path:
    """The end-of-run picture: `<run_dir>/training_curves.png`."""
    return plot_runs(
        [run_dir], Path(run_dir) / CURVES_PNG, labels=[Path(run_dir).name], title=f"agrpo run {Path(run_dir).name}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agrpo plot", description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding log_history.json")
    parser.add_argument(
        "-o",
        "--output",
        help=f"PNG to write (default: <RUN_DIR>/{CURVES_PNG} for one run, "
        "runs_comparison.png in the working directory for several)",
    )
    args = parser.parse_args(argv)
    out = args.output or (Path(args.run_dirs[0]) / CURVES_PNG if len(args.run_dirs) == 1 else "runs_comparison.png")
    try:
        path = plot_runs(args.run_dirs, out)
    except PlotError as error:
        print(f"agrpo plot: error: {error}", file=sys.stderr)
        return 2
    print(f"agrpo plot: wrote {path}")
    return 0
