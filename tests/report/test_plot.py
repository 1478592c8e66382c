"""`agrpo plot`: curves of real run histories (a 60-step smoke run in data/), one run or several overlaid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agrpo.report.plot import CURVES_PNG, main, plot_run_dir, plot_runs, run_label, series

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
