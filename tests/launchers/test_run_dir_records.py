"""What a run dir records for the commands printed later (a recipe file as typed), and run dirs that hold nothing:
a dry run or a run refused before it started leaves none behind (agrpo/launchers/run_dir.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from agrpo.config.recipe_files import record_recipe_files, typed_overrides
from agrpo.launchers.run_dir import discard_if_empty, holds_nothing


def agrpo(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agrpo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "AGRPO_CACHE": str(cwd / "cache")},
    )


def test_a_dry_run_and_a_refused_run_leave_no_run_folder(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - /recipe/smoke\nrun_name: mine\n")
    dry = agrpo(tmp_path, "+recipe=mine.yaml", "launcher.dry_run=true")
    assert dry.returncode == 0 and "[trainer] trainer" in dry.stdout, dry.stderr
    refused = agrpo(tmp_path, "+recipe=mine.yaml", "trainer.top_p=2")
    assert refused.returncode == 2 and "trainer.top_p" in refused.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_run_dir_with_anything_of_agrpos_is_kept(tmp_path):
    run = tmp_path / "outputs" / "x" / "2026-12-01_00-00-00"
    (run / ".hydra").mkdir(parents=True)
    (run / "cli.log").write_text("")
    (run / "config.yaml").write_text("")
    assert not holds_nothing(run) and not discard_if_empty(run) and run.is_dir()
    (run / "config.yaml").unlink()
    os.chdir(tmp_path)
    assert discard_if_empty(run) and not (tmp_path / "outputs").exists()  # the emptied parents go too
    assert not discard_if_empty(tmp_path)  # never the working directory


def test_a_recipe_file_is_recorded_as_typed(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- +recipe=my_task\n- lora.r=4\n")
    assert typed_overrides(tmp_path) == ["+recipe=my_task", "lora.r=4"]
    record_recipe_files(tmp_path, {"my_task": "tasks/my_task.yaml"})
    assert typed_overrides(tmp_path) == ["+recipe=tasks/my_task.yaml", "lora.r=4"]
    assert typed_overrides(tmp_path / "nowhere") == []
