"""A sweep point whose metrics.json or sweep_point.json is garbage is a row that says so, never the end of the sweep's
summary (agrpo/sweeps.py reads them through agrpo/interprocess.py)."""

from __future__ import annotations

from agrpo.interprocess import SKIPPED
from agrpo.sweeps import POINT_FILE, collect_points


def point(sweep, name: str, metrics: str, record: str) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / "metrics.json").write_text(metrics)
    (job / POINT_FILE).write_text(record)


def test_garbage_point_files_read_as_no_metrics_and_are_counted(tmp_path):
    point(tmp_path, "0", '{"reward_last": 0.5, "reward_first": 0.1, "global_step": 3}', '{"status": "completed"}')
    point(tmp_path, "1", "[1]", "NaN")
    point(tmp_path, "2", '{"reward_last": "x"}', '{"status": "completed", "wall_s": 1e999}')
    before = SKIPPED.total
    rows = collect_points(tmp_path)
    assert [(r.job, r.status, r.reward_last, r.steps) for r in rows] == [
        ("0", "ok", 0.5, 3),
        ("1", "no metrics", None, None),
        ("2", "no metrics", None, None),
    ]
    assert rows[2].wall_s is None  # 1e999 read as null, not inf
    assert SKIPPED.total - before == 3  # [1], NaN as a point record, "x" as a reward
