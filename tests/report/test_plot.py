"""`agrpo plot`: curves of real run histories (a 60-step smoke run in data/), one run or several overlaid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agrpo.plot import CURVES_PNG, main, plot_run_dir, plot_runs, run_label, series

DATA = Path(__file__).parent / "data" / "smoke_log_history.json"


def make_run(root: Path, name: str, scale: float = 1.0) -> Path:
    run = root / name
    run.mkdir(parents=True)
    history = json.loads(DATA.read_text())
    for entry in history:
        if "reward" in entry:
            entry["reward"] *= scale
    (run / "log_history.json").write_text(json.dumps(history))
    return run


def colours(png: Path) -> set[tuple[int, int, int]]:
    import matplotlib.image

    pixels = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    return {tuple(p) for p in pixels}


BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's C0 and C1: run 1 and run 2


def test_series_reads_steps_and_skips_entries_without_the_metric():
    history = json.loads(DATA.read_text())
    steps, values = series(history, "perf/step_s")
    assert steps[0] == 2 and len(steps) == 59  # step 1 logs no step time; the train_runtime entry is not a step
    assert values[-1] == pytest.approx(0.3427972060000002)
    assert series([{"kl": float("nan"), "step": 1}, {"kl": None}, {"kl": 0.5}], "kl") == ([3], [0.5])


def test_end_of_run_picture_lands_in_the_run_dir(tmp_path):
    run = make_run(tmp_path, "2026-12-01_03-41-14")
    png = plot_run_dir(run)
    assert png == run / CURVES_PNG and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (770, 1210)
    seen = colours(png)
    assert BLUE in seen and ORANGE not in seen


def test_several_runs_are_overlaid_in_their_own_colours(tmp_path):
    one, two = make_run(tmp_path / "smoke", "a"), make_run(tmp_path / "smoke", "b", scale=0.5)
    png = plot_runs([one, two], tmp_path / "both.png")
    seen = colours(png)
    assert BLUE in seen and ORANGE in seen


def test_labels_are_the_shortest_tails_that_tell_runs_apart(tmp_path):
    dirs = [tmp_path / "smoke" / "2026-12-01", tmp_path / "gsm8k" / "2026-12-01"]
    assert [run_label(d, dirs) for d in dirs] == ["smoke/2026-12-01", "gsm8k/2026-12-01"]
    assert run_label(dirs[0], dirs[:1]) == "2026-12-01"


def test_cli_writes_the_png_and_rejects_a_folder_without_history(tmp_path, capsys):
    run = make_run(tmp_path, "run")
    assert main([str(run)]) == 0
    assert (run / CURVES_PNG).is_file() and f"wrote {run / CURVES_PNG}" in capsys.readouterr().out
    other = make_run(tmp_path, "other")
    assert main([str(run), str(other), "-o", str(tmp_path / "cmp.png")]) == 0 and (tmp_path / "cmp.png").is_file()
    shutil.rmtree(other)
    assert main([str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agrpo plot: error: ") and "log_history.json does not exist" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_agrpo_plot_never_replaces_a_picture_unless_told(tmp_path, capsys):
    run = make_run(tmp_path, "run")
    plot_run_dir(run)  # what every run draws at its end
    before = (run / CURVES_PNG).read_bytes()
    assert main([str(run)]) == 0 and (run / "training_curves-2.png").is_file()
    assert main([str(run)]) == 0 and (run / "training_curves-3.png").is_file()
    assert (run / CURVES_PNG).read_bytes() == before
    out = tmp_path / "mine.png"
    assert main([str(run), "-o", str(out)]) == 0
    assert main([str(run), "-o", str(out)]) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([str(run), "-o", str(out), "--overwrite"]) == 0


def test_runs_that_did_not_finish_are_skipped_among_several(tmp_path, capsys):
    done, failed = make_run(tmp_path, "done"), tmp_path / "failed"
    failed.mkdir()
    assert main([str(done), str(failed), "-o", str(tmp_path / "all.png")]) == 0
    assert f"skipping {failed}" in capsys.readouterr().err and (tmp_path / "all.png").is_file()


TWO_TERMS = """reward:
  funcs:
    - {_target_: agrpo.rewards.generic.numeric_match, weight: 1.0}
    - {_target_: agrpo.rewards.generic.regex_match, regex: x, weight: 0.5}
"""


def test_two_terms_are_drawn_dashed_and_the_band_stays_in_reach(tmp_path):
    from agrpo.plot import Run, plot_histories, read_terms

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(TWO_TERMS)
    weights, bounds = read_terms(run)
    assert weights == {"numeric_match": 1.0, "regex_match": 0.5} and bounds == (0.0, 1.5)
    history = [
        {"step": s, "reward": 0.05, "reward_std": 0.5, "rewards/numeric_match": 0.0, "rewards/regex_match": 0.05}
        for s in range(1, 11)
    ]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captured = {}
    original = plt.close
    plt.close = lambda fig: captured.setdefault("fig", fig)  # keep the figure to read what was drawn
    try:
        plot_histories([Run("run", history, weights, bounds)], tmp_path / "two.png")
    finally:
        plt.close = original
    reward_axes = captured["fig"].axes[0]
    labels = [line.get_label() for line in reward_axes.get_lines()]
    assert labels == ["run", "run: numeric_match x 1", "run: regex_match x 0.5"]
    assert [line.get_linestyle() for line in reward_axes.get_lines()][1:] == ["--", ":"]
    [band] = reward_axes.collections
    lows = band.get_paths()[0].vertices[:, 1]
    assert lows.min() == pytest.approx(0.0)  # 0.05 - 0.5 would draw the band below what the reward can reach
    assert read_terms(tmp_path) == ({}, None)  # no config.yaml: no per-term labels, no clipping


AGENT = Path(__file__).parent / "data" / "agent_log_history.json"  # 30 steps of agent_smoke (two replicas)


def drawn_figure(monkeypatch, runs, png):
    """Draw `runs` and keep the figure, to read what each panel holds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agrpo.plot import plot_histories

    captured = {}
    monkeypatch.setattr(plt, "close", lambda fig: captured.setdefault("fig", fig))
    plot_histories(runs, png)
    return captured["fig"]


def test_an_agent_run_gets_the_tool_use_panels(tmp_path, monkeypatch):
    history = json.loads(AGENT.read_text())
    history[4]["agent/tool_failures_done_total"] = 3.0  # step 5: 3 of its 11 finished calls failed
    run = tmp_path / "agent"
    run.mkdir()
    (run / "log_history.json").write_text(json.dumps(history))
    png = plot_run_dir(run)
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (1155, 1210)  # three rows of panels instead of two
    assert BLUE in colours(png)
    fig = drawn_figure(monkeypatch, [("agent", history)], tmp_path / "agent.png")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[4:] == ["tool use: calls per episode", "tool use: failed share of finished calls"]
    [calls] = fig.axes[4].get_lines()
    assert list(calls.get_xdata()[:3]) == [1, 2, 3] and list(calls.get_ydata()[:3]) == [0.09375, 0.25, 0.1875]
    [failed] = fig.axes[5].get_lines()
    assert 7 not in list(failed.get_xdata())  # step 7 finished no call: no share to draw
    shares = dict(zip(failed.get_xdata(), failed.get_ydata()))
    assert shares[5] == pytest.approx(3 / 11) and shares[4] == 0.0


def test_failure_share_falls_back_to_trl_without_agrpo_counts():
    from agrpo.plot import failure_share

    history = [{"step": 1, "tools/failure_frequency": 0.5}, {"step": 2, "tools/failure_frequency": 0.0}]
    assert failure_share(history) == ([1, 2], [0.5, 0.0])


def test_a_run_without_tools_keeps_four_panels(tmp_path, monkeypatch):
    fig = drawn_figure(monkeypatch, [("smoke", json.loads(DATA.read_text()))], tmp_path / "smoke.png")
    assert len(fig.axes) == 4 and not any("tool" in ax.get_title() for ax in fig.axes)
