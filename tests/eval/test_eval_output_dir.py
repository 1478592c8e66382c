"""Where `agrpo eval` writes: under the run of the adapter it scores (where `agrpo push RUN` reads evaluations)."""

from __future__ import annotations

from omegaconf import OmegaConf

from agrpo.eval.cli import output_dir, run_dir_of


def config(adapter=None, out=None):
    return OmegaConf.create({"run_name": "my_task", "eval": {"adapter": adapter, "output_dir": out}})


def test_a_runs_adapter_is_evaluated_into_the_run(tmp_path, monkeypatch):
    run = tmp_path / "outputs" / "my_task" / "2026-12-01_10-00-00"
    (run / "final_adapter").mkdir(parents=True)
    (run / "config.yaml").write_text("run_name: my_task\n")
    assert run_dir_of(str(run / "final_adapter")) == run
    assert output_dir(config(str(run / "final_adapter"))).parent == run / "eval"
    monkeypatch.chdir(tmp_path)
    loose = tmp_path / "some_adapter"
    loose.mkdir()
    assert output_dir(config(str(loose))).parent == tmp_path / "outputs" / "eval" / "my_task"  # not a run's
    assert output_dir(config()).parent == tmp_path / "outputs" / "eval" / "my_task"  # the base model
    assert output_dir(config(str(run / "final_adapter"), "base_eval")) == tmp_path / "base_eval"
