"""The rehearsal is its own part (agrpo/rehearsal): it imports nothing of the launchers, its knobs live under
`rehearsal.*` (the test-only preemption knob in no schema at all), and the old `launcher.hf_jobs.rehearse*` spellings
still work from the command line."""

import ast
import subprocess
from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.rehearsal.spelling import RENAMED, respell
from tests.launchers.rehearsal_run import rehearsal_command, rehearsal_env

REPO = Path(__file__).resolve().parents[2]


def test_the_rehearsal_imports_nothing_of_the_launchers():
    for module in sorted((REPO / "agrpo" / "rehearsal").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            assert not any(name.startswith("agrpo.launchers") for name in names), (module.name, names)


def test_its_knobs_live_under_their_own_node_and_the_preemption_knob_in_none():
    cfg = compose_run_config(["rehearsal.enabled=true", "rehearsal.dir=/tmp/r", "rehearsal.listing_lag_s=2"])
    assert (cfg.rehearsal.enabled, cfg.rehearsal.dir, cfg.rehearsal.listing_lag_s) == (True, "/tmp/r", 2.0)
    assert not any(key.startswith("rehearse") for key in cfg.launcher.hf_jobs)
    for override in ("launcher.hf_jobs.rehearse_preempt_trainer_after_s=5", "rehearsal.preempt_trainer_after_s=5"):
        with pytest.raises(Exception, match="preempt_trainer_after_s"):
            compose_run_config([override])


def test_old_spellings_are_rewritten_with_a_note():
    out, notes = respell(["+recipe=smoke", "launcher.hf_jobs.rehearse=true", "launcher.hf_jobs.rehearse_dir=/r"])
    assert out == ["+recipe=smoke", "rehearsal.enabled=true", "rehearsal.dir=/r"]
    assert notes[0] == "launcher.hf_jobs.rehearse is now rehearsal.enabled: read as rehearsal.enabled=true"


def test_the_old_command_still_plans_a_rehearsal(tmp_path):
    old = {new: old for old, new in RENAMED.items()}
    command = [
        "=".join([old.get(key, key), value]) if sep else key
        for key, sep, value in (arg.partition("=") for arg in rehearsal_command(tmp_path / "r", "old"))
    ]
    assert "launcher.hf_jobs.rehearse=true" in command and "rehearsal.enabled=true" not in command
    done = subprocess.run(
        [*command, "inference.device=cpu", "launcher.dry_run=true"],
        cwd=tmp_path,
        env=rehearsal_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "launcher.hf_jobs.rehearse is now rehearsal.enabled" in done.stderr
    assert "rehearse: every Job below runs on this machine" in done.stdout and str(tmp_path / "r") in done.stdout
