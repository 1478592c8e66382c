"""A sweep point that raises an exception agrpo does not know costs that point only (issue 43's leftovers, item 1):
its row says why, its traceback is kept, the other points run and the table is printed, and `agrpo` exits non-zero
at the end. Through the real CLI on hydra-joblib-launcher (the launcher of a sweep on a shared fleet); the trigger is
a real one: a model folder whose config.json has a field of the wrong type, which transformers refuses with its own
exception while agrpo's data checks open the tokenizer."""

from __future__ import annotations

import json

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from agrpo.sweeps import ERROR_FILE, POINT_FILE, TRACEBACK_FILE, SweepSummary, collect_points
from tests.processes import agrpo


def failed_job(error: Exception) -> JobReturn:
    try:
        raise error
    except Exception as raised:  # with its traceback, as Hydra's run_job keeps it
        return JobReturn(status=JobStatus.FAILED, _return_value=raised)


def multirun_config(job_dir):
    return OmegaConf.create({"hydra": {"mode": "RunMode.MULTIRUN", "runtime": {"output_dir": str(job_dir)}}})


def test_an_unknown_exception_becomes_the_points_row_and_no_longer_ends_the_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("AGRPO_DEBUG", raising=False)
    job_dir = tmp_path / "3"
    (job_dir / ".hydra").mkdir(parents=True)
    job = failed_job(ModuleNotFoundError("Could not import module 'PreTrainedModel'"))
    SweepSummary().on_job_end(multirun_config(job_dir), job)
    assert job.status == JobStatus.COMPLETED and job.return_value is None  # the sweeper raises nothing at the end
    error = (job_dir / ERROR_FILE).read_text()
    assert error.startswith("ModuleNotFoundError: Could not import module 'PreTrainedModel' (not an agrpo error")
    assert str(job_dir / TRACEBACK_FILE) in error
    trace = (job_dir / TRACEBACK_FILE).read_text()
    assert trace.startswith("Traceback (most recent call last)") and "in failed_job" in trace
    assert json.loads((job_dir / POINT_FILE).read_text())["status"] == "failed"
    [row] = collect_points(tmp_path)
    assert (row.status, row.error) == ("failed", error)
    assert "agrpo: error: sweep point 3: ModuleNotFoundError" in capsys.readouterr().err


def test_agrpos_own_message_is_kept_and_debug_mode_lets_hydra_raise(tmp_path, monkeypatch):
    job_dir = tmp_path / "0"
    job_dir.mkdir()
    (job_dir / ERROR_FILE).write_text("what the CLI said")  # a paragraph already written is not replaced
    job = failed_job(RuntimeError("boom"))
    SweepSummary().on_job_end(multirun_config(job_dir), job)
    assert (job_dir / ERROR_FILE).read_text() == "what the CLI said" and job.status == JobStatus.COMPLETED
    monkeypatch.setenv("AGRPO_DEBUG", "1")
    debug = failed_job(RuntimeError("boom"))
    SweepSummary().on_job_end(multirun_config(tmp_path / "1"), debug)
    assert debug.status == JobStatus.FAILED and isinstance(debug._return_value, RuntimeError)
    assert json.loads((tmp_path / "1" / POINT_FILE).read_text())["status"] == "failed"


def test_a_joblib_sweep_runs_past_a_point_that_raises_then_exits_non_zero(tmp_path):
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": "x"}))
    result = agrpo(
        "-m", "+recipe=smoke", "launcher.dry_run=true", f"model.name_or_path={bad},${{cache_dir}}/models/tiny-qwen2",
        "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr  # one paragraph per point, not Hydra's traceback
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert "| failed |" in rows[0] and "| no metrics |" in rows[1]  # the other point ran
    assert "hidden_size" in result.stdout.split("job 0 failed: ", 1)[1]  # its row says why
    assert "sweep point(s) 0 failed (see the table above)" in result.stderr
    [summary] = tmp_path.glob("outputs/multirun/smoke/*/sweep_summary.md")
    assert "| failed |" in summary.read_text()
