"""agrpo plot RUN_DIR [RUN_DIR ...] [-o OUT.png] [--overwrite]: a picture of one or more runs over steps.

Four panels from each run's <run_dir>/log_history.json (written by the trainer): the reward (the total, which is the
sum of the weighted terms, with its band of ± TRL's reward_std clipped to the range the terms can reach; with two
terms or more, each weighted term dashed), the KL between the trained and the sampling policy, the completion length
and the step time; several runs overlaid with a legend. An agent run (one that logged tool figures) gets two more:
tool calls per episode, and the share of the step's finished tool calls that failed. Readable without TensorBoard, small enough for a model card
or an issue. Drawing uses matplotlib's Agg backend (no display needed).

Every run writes <run_dir>/training_curves.png at its end (`plot_run_dir`). `agrpo plot` never replaces a picture:
it writes training_curves-2.png (-3, ...) next to it, or refuses an existing -o file, unless --overwrite is given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_HISTORY_FILE = "log_history.json"  # every logged step's metrics (the trainer writes it), for scripts too
CURVES_PNG = "training_curves.png"

CONFIG_FILE = "config.yaml"  # the run's resolved config: reward term weights, for the per-term curves and the band

# (panel title, TRL's metric, y label). The reward is the sum of the weighted terms; its band is ± TRL's reward_std
# (the spread of rewards within each prompt's group of completions, averaged over the step).
PANELS = [
    ("reward (total of the weighted terms)", "reward", "mean reward (band: ± reward_std)"),
    ("KL, trained vs sampling policy", "kl", "kl"),
    ("completion length", "completions/mean_length", "tokens"),
    ("step time", "perf/step_s", "seconds"),
]
# The tool-use panels of an agent run: TRL's calls per episode, and the failed share of the calls that ended in the
# step (agrpo's loop counts both together, so the share is exact; without them, TRL's own failure_frequency).
CALLS_PER_EPISODE = "tools/call_frequency"
FAILURE_SHARE = "tool failure share"  # derived per step by `failure_share`
TOOL_PANELS = [
    ("tool use: calls per episode", CALLS_PER_EPISODE, "tool calls / episode"),
    ("tool use: failed share of finished calls", FAILURE_SHARE, "share failed"),
]
CALLS_DONE, FAILURES_DONE = "agent/tool_calls_done_total", "agent/tool_failures_done_total"


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


def failure_share(history: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, failed share) of the tool calls that ended in each step: agrpo's counts where a step has finished
    calls (none finished: no point), else TRL's `tools/failure_frequency`."""
    steps, values = [], []
    trl_steps, trl_values = series(history, "tools/failure_frequency")
    trl = dict(zip(trl_steps, trl_values))
    done_steps, done = series(history, CALLS_DONE)
    if not done_steps:
        return trl_steps, trl_values
    failed = dict(zip(*series(history, FAILURES_DONE)))
    for step, calls in zip(done_steps, done):
        if calls > 0:
            steps.append(step)
            values.append(failed.get(step, trl.get(step, 0.0) * calls) / calls)
    return steps, values


def is_agent_run(history: list[dict[str, Any]]) -> bool:
    return any(CALLS_PER_EPISODE in entry for entry in history)


def panel_series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    return failure_share(history) if key == FAILURE_SHARE else series(history, key)


def run_label(run_dir: str | Path, all_dirs: list[Path]) -> str:
    """The shortest tail of the path that tells the runs apart (e.g. smoke/2026-12-01_03-41-14)."""
    parts = Path(run_dir).resolve().parts
    for depth in range(1, len(parts) + 1):
        tails = {Path(*Path(d).resolve().parts[-depth:]) for d in all_dirs}
        if len(tails) == len(all_dirs):
            return str(Path(*parts[-depth:]))
    return str(run_dir)


def read_terms(run_dir: str | Path) -> tuple[dict[str, float], tuple[float, float] | None]:
    """The run's reward terms from its config.yaml: {name as TRL logs it: weight}, and the range the total can
    reach when every term is one of agrpo's rewards (they score in [0, 1]): negative weights below 0, positive ones
    above. ({}, None) when the config cannot be read; no range when a term of one's own may score anything."""
    from omegaconf import OmegaConf

    from agrpo.rewards.registry import term_weights

    try:
        funcs = OmegaConf.load(Path(run_dir) / CONFIG_FILE).reward.funcs
        weights = term_weights(funcs)
    except Exception:  # a run dir without its config: no per-term labels, no clipping
        return {}, None
    ours = all(str(t.get("reward") or t.get("_target_")).startswith("agrpo.rewards.") for t in funcs)
    if not weights or not ours:
        return weights, None
    return weights, (sum(min(w, 0.0) for w in weights.values()), sum(max(w, 0.0) for w in weights.values()))


def _reward_panel(ax: Any, steps: list[int], values: list[float], history: list[dict[str, Any]], run: Run) -> None:
    """The band (± reward_std, clipped to the reachable range) and, with two terms or more, each weighted term."""
    std_steps, stds = series(history, "reward_std")
    if std_steps == steps:
        low, high = run.bounds or (-math.inf, math.inf)
        ax.fill_between(
            steps,
            [max(v - s, low) for v, s in zip(values, stds)],
            [min(v + s, high) for v, s in zip(values, stds)],
            color=run.color,
            alpha=0.15,
            linewidth=0,
        )
    if len(run.weights) < 2:
        return
    for style, (name, weight) in zip(("--", ":", "-.", (0, (5, 1))) * 4, run.weights.items()):
        term_steps, term_values = series(history, f"rewards/{name}")
        if term_steps:
            ax.plot(
                term_steps, term_values, color=run.color, linestyle=style, linewidth=1.0, label=run.term_label(name)
            )


@dataclass
class Run:
    label: str
    history: list[dict[str, Any]]
    weights: dict[str, float] = field(default_factory=dict)
    bounds: tuple[float, float] | None = None
    color: str = "C0"

    def term_label(self, name: str) -> str:
        return f"{self.label}: {name} x {self.weights[name]:g}"


def plot_histories(
    runs: list[tuple[str, list[dict[str, Any]]]] | list[Run], out_png: str | Path, title: str | None = None
) -> Path:
    """Draw the four panels (six for agent runs) for each run ((label, history) or Run), overlaid; returns the PNG's
    path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r if isinstance(r, Run) else Run(r[0], r[1]) for r in runs]
    for index, run in enumerate(runs):
        run.color = f"C{index % 10}"
    panels = PANELS + (TOOL_PANELS if any(is_agent_run(run.history) for run in runs) else [])
    rows = len(panels) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.5 * rows), sharex=True)
    for (panel, key, ylabel), ax in zip(panels, axes.flat):
        for run in runs:
            steps, values = panel_series(run.history, key)
            if not steps:
                continue
            ax.plot(steps, values, color=run.color, linewidth=1.4, label=run.label)
            if key == "reward":
                _reward_panel(ax, steps, values, run.history, run)
        ax.set_title(panel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if key == FAILURE_SHARE:
            ax.set_ylim(-0.05, 1.05)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if not handles:  # no rewards logged: take the legend from any panel that has lines
        for ax in axes.flat:
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                break
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=9, frameon=False)
        if any(len(run.weights) > 1 for run in runs):
            axes.flat[0].annotate(
                "dashed: each term x its weight", (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=8
            )
    fig.suptitle(title or ("agrpo run" if len(runs) == 1 else f"agrpo: {len(runs)} runs"))
    legend_room = (0.04 + 0.03 * ((len(labels) - 1) // 3 if handles else 0)) * 2 / rows
    fig.tight_layout(rect=(0, legend_room, 1, 1))
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
    return plot_histories([Run(name, read_history(d), *read_terms(d)) for name, d in zip(names, dirs)], out_png, title)


def plot_run_dir(run_dir: str | Path) -> Path:
    """The end-of-run picture: `<run_dir>/training_curves.png`."""
    return plot_runs(
        [run_dir], Path(run_dir) / CURVES_PNG, labels=[Path(run_dir).name], title=f"agrpo run {Path(run_dir).name}"
    )


def free_path(path: Path) -> Path:
    """`path`, or the first of path-2, path-3, ... (same suffix) that does not exist yet."""
    if not path.exists():
        return path
    number = 2
    while (candidate := path.with_name(f"{path.stem}-{number}{path.suffix}")).exists():
        number += 1
    return candidate


def output_path(run_dirs: list[str], output: str | None, overwrite: bool) -> Path:
    """Where `agrpo plot` writes: -o as given (an existing file only with --overwrite), else the default name, or
    the next free one beside it (an earlier picture is never replaced silently)."""
    if output:
        path = Path(output)
        if path.exists() and not overwrite:
            raise PlotError(f"{path} exists: pass --overwrite to replace it, or choose another -o")
        return path
    default = Path(run_dirs[0]) / CURVES_PNG if len(run_dirs) == 1 else Path("runs_comparison.png")
    return default if overwrite else free_path(default)


def finished(run_dirs: list[str]) -> list[str]:
    """Of several run dirs (a glob over a task's runs), those with a history to draw; the others are named."""
    if len(run_dirs) < 2:
        return run_dirs
    drawn = [d for d in run_dirs if (Path(d) / LOG_HISTORY_FILE).is_file()]
    for skipped in (d for d in run_dirs if d not in drawn):
        print(f"agrpo plot: skipping {skipped} (no {LOG_HISTORY_FILE}: the run did not finish)", file=sys.stderr)
    return drawn or run_dirs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="agrpo plot",
        description=__doc__.split("\n", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding log_history.json")
    parser.add_argument(
        "-o",
        "--output",
        help=f"PNG to write (default: <RUN_DIR>/{CURVES_PNG} for one run, runs_comparison.png in the working "
        "directory for several; when that file exists, the next free name: -2, -3, ...)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the output file if it exists")
    args = parser.parse_args(argv)
    run_dirs = finished(args.run_dirs)
    try:
        path = plot_runs(run_dirs, output_path(run_dirs, args.output, args.overwrite))
    except PlotError as error:
        print(f"agrpo plot: error: {error}", file=sys.stderr)
        return 2
    print(f"agrpo plot: wrote {path}")
    return 0
