"""The trainer's one-paragraph error reaches the user once, through the launcher (agrpo/trainer/trainer_error.py)."""

from __future__ import annotations

from agrpo.launchers.local import build_local_plan
from agrpo.trainer.trainer_error import (
    TRAINER_ERROR_ENV,
    clear_trainer_error,
    report_trainer_error,
    trainer_error_file,
    trainer_failure,
)


def test_a_launched_trainer_writes_its_error_and_the_launcher_shows_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TRAINER_ERROR_ENV, str(trainer_error_file(tmp_path)))
    report_trainer_error("reward term 'x' raised ValueError: boom while scoring the row [prompt 'q'].")
    assert capsys.readouterr().err == ""  # the launcher shows it, not the trainer
    text = trainer_failure(tmp_path, 1)
    assert text.startswith("reward term 'x' raised ValueError: boom while scoring the row [prompt 'q']. The trainer")
    assert f"the run directory {tmp_path} keeps the checkpoints, adapters and logs" in text
    clear_trainer_error(tmp_path)
    assert trainer_failure(tmp_path, 1).startswith("the trainer exited with code 1 (its output is above)")


def test_a_trainer_started_alone_prints_its_error(monkeypatch, capsys):
    monkeypatch.delenv(TRAINER_ERROR_ENV, raising=False)
    report_trainer_error("it broke")
    assert capsys.readouterr().err == "agrpo trainer: it broke\n"


def test_the_local_plan_tells_the_trainer_where_to_write_it(tmp_path):
    from tests.specs import spec_for

    cfg = spec_for("+recipe=smoke", output_dir=str(tmp_path))
    plan = build_local_plan(cfg, str(tmp_path), "cpu", 0, [0, 1])
    assert plan.trainer.env[TRAINER_ERROR_ENV] == str(tmp_path / "logs" / "trainer_error.txt")
