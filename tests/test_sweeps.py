"""Sweeps: the summary table (from job-dir files), a multirun that keeps going past a failed point, the Optuna
recipe. A real 2-point multirun of the smoke recipe, each point with its own replica, runs beside another run in
tests/launchers/test_hygiene.py (one boot saved, and the two share the machine as users' runs do)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from agrpo.sweeps import CURVES_PNG, POINT_FILE, collect_points, plot_points, render_table
from tests.processes import agrpo as run_agrpo

SMOKE_HISTORY = Path(__file__).parent / "report" / "data" / "smoke_log_history.json"  # a real 60-step run


def agrpo(*args, cwd, timeout=300):
    return run_agrpo(*args, cwd=cwd, timeout=timeout)


def fake_point(sweep_dir: Path, num: int, overrides: list[str], metrics: dict | None, point: dict | None) -> None:
    job = sweep_dir / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))
    if point is not None:
        (job / POINT_FILE).write_text(json.dumps(point))


def test_table_lists_every_point_with_what_varies_reward_and_wall_time(tmp_path):
    common = ["+recipe=smoke", "trainer.max_steps=2"]
    fake_point(
        tmp_path,
        0,
        [*common, "lora.r=1"],
        {"reward_last": 0.2, "reward_first": 0.1, "global_step": 2, "wall_time_s": 30.0},
        {"status": "completed", "wall_s": 70.0},
    )
    fake_point(
        tmp_path, 1, [*common, "lora.r=4"], {"reward_last": 0.3, "reward_first": 0.1, "global_step": 2}, None
    )  # ran elsewhere (another process, a Job): metrics only
    fake_point(tmp_path, 10, [*common, "lora.r=64"], None, {"status": "failed", "error": "lora.r too big"})
    rows = collect_points(tmp_path)
    assert [row.job for row in rows] == ["0", "1", "10"]  # numeric order
    assert [row.status for row in rows] == ["ok", "ok", "failed"]
    table = render_table(rows)
    assert "common overrides: +recipe=smoke trainer.max_steps=2" in table
    assert "| 0 | lora.r=1 | ok | 0.2000 | 0.1000 | 2 | 70 s | 30 s |" in table
    assert "| 1 | lora.r=4 | ok | 0.3000 (best) |" in table
    assert "job 10 failed: lora.r too big" in table


def test_sweep_curves_overlay_the_points_that_left_a_history(tmp_path):
    fake_point(tmp_path, 0, ["+recipe=smoke", "lora.r=1"], {"reward_last": 0.9}, None)
    fake_point(tmp_path, 1, ["+recipe=smoke", "lora.r=4"], {"reward_last": 0.8}, None)
    fake_point(tmp_path, 2, ["+recipe=smoke", "lora.r=64"], None, {"status": "failed"})  # no history: not drawn
    for num in (0, 1):
        (tmp_path / str(num) / "log_history.json").write_text(SMOKE_HISTORY.read_text())
    png = plot_points(tmp_path, collect_points(tmp_path))
    assert png == tmp_path / CURVES_PNG and png.read_bytes()[:4] == b"\x89PNG"
    import matplotlib.image

    pixels = {tuple(p) for p in (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int).reshape(-1, 3)}
    assert (31, 119, 180) in pixels and (255, 127, 14) in pixels and (44, 160, 44) not in pixels  # C0, C1; no C2
    (tmp_path / "0" / "log_history.json").write_text("not json")
    assert plot_points(tmp_path, collect_points(tmp_path)) is None  # a warning, not a failed sweep
    assert plot_points(tmp_path / "2", []) is None


def test_multirun_runs_every_point_past_a_failed_one_then_exits_non_zero(tmp_path):
    result = agrpo("-m", "+recipe=smoke", "launcher.dry_run=true", "inference.max_loras=2,3", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "inference.max_loras=2 is below" in result.stderr  # the failed point's own message
    assert "sweep point(s) 0 failed" in result.stderr
    assert "| 0 | inference.max_loras=2 | failed |" in result.stdout
    assert "| 1 | inference.max_loras=3 | no metrics |" in result.stdout  # the next point still ran (dry run)
    summary = list(tmp_path.glob("outputs/multirun/smoke/*/sweep_summary.md"))
    assert len(summary) == 1 and "max_loras=3" in summary[0].read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+-[0-9a-f]{4}", summary[0].parent.name)  # unique


def test_optuna_recipe_composes_with_the_optuna_sweeper(tmp_path):
    import hydra_plugins.hydra_optuna_sweeper  # noqa: F401 - the test extra installs it (make setup); else this fails

    result = agrpo("+recipe=smoke_optuna", "--cfg", "hydra", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    sweeper = yaml.safe_load(result.stdout)["hydra"]["sweeper"]
    assert sweeper["_target_"].endswith("OptunaSweeper") and sweeper["direction"] == "maximize"
    assert set(sweeper["params"]) == {"trainer.learning_rate", "lora.r"}


def test_points_on_a_shared_fleet_show_their_share_of_its_replica_seconds(tmp_path):
    shared = {"reward_last": 0.5, "global_step": 5}
    # metrics.json's section as agrpo/trainer/sync/tenant_lease.py writes it: replica_seconds_share is the run's seconds
    fleet = {"fleet_replica_seconds": 200.0, "tokens": 900}
    fake_point(
        tmp_path,
        0,
        ["lora.r=1"],
        {**shared, "shared_fleet": {**fleet, "replica_seconds_share": 62.0, "share_of_fleet": 0.31}},
        None,
    )
    fake_point(tmp_path, 1, ["lora.r=4"], {**shared, "shared_fleet": {"replica_seconds_share": "bad"}}, None)
    fake_point(tmp_path, 2, ["lora.r=8"], {**shared, "shared_fleet": {"share_of_fleet": 0.69}}, None)
    rows = collect_points(tmp_path)
    assert [row.fleet_share for row in rows] == [0.31, None, 0.69]
    assert [row.fleet_replica_s for row in rows] == [62.0, None, None]
    table = render_table(rows)
    assert table.splitlines()[1].endswith("| trainer | fleet share |")
    assert table.splitlines()[3].endswith("| 31% (62 replica-s) |") and table.splitlines()[4].endswith("| - |")
    assert table.splitlines()[5].endswith("| 69% |")
    fake_point(tmp_path / "own", 0, ["lora.r=1"], shared, None)  # own fleets: no share column
    assert "fleet share" not in render_table(collect_points(tmp_path / "own"))


def test_a_multirun_on_the_joblib_launcher_runs_its_points_in_workers_and_tables_them(tmp_path):
    # What a shared-fleet sweep gets (agrpo/sweep_fleet.py); dry runs, so no vLLM: the launcher and the callbacks only.
    result = agrpo(
        "-m", "+recipe=smoke", "launcher.dry_run=true", "lora.r=1,4", "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Joblib.Parallel(n_jobs=2" in result.stdout + result.stderr
    assert "| 0 | lora.r=1 | no metrics |" in result.stdout and "| 1 | lora.r=4 | no metrics |" in result.stdout
    points = sorted(tmp_path.glob("outputs/multirun/smoke/*/*/sweep_point.json"))
    assert [json.loads(p.read_text())["status"] for p in points] == ["completed", "completed"]
    assert points[0].parent.parent == points[1].parent.parent  # one sweep dir, though each worker is its own process


def test_a_sweep_on_a_shared_fleet_ends_with_the_fleets_replica_seconds(tmp_path):
    from agrpo.sweeps import fleet_line

    assert fleet_line(tmp_path) == ""  # own fleets: no line
    fleet_dir = tmp_path / "fleet_run"
    note = {"name": "sweep", "run_dir": str(fleet_dir), "started_by_sweep": True}
    (tmp_path / "sweep_fleet.json").write_text(json.dumps(note))
    assert fleet_line(tmp_path) == "\nfleet sweep (started and stopped by this sweep): no fleet_summary.json yet"
    fleet_dir.mkdir()
    (fleet_dir / "fleet_summary.json").write_text(json.dumps({"replica_seconds": 231.4, "up_s": 118.0}))
    assert fleet_line(tmp_path).startswith(
        "\nfleet sweep (started and stopped by this sweep): 231 replica-seconds in all, up 118 s (its summary: "
    )
