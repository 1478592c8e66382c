"""The rehearsal is its own part (agrpo/rehearsal) and a Hub backend, not a config key: it imports nothing of the
launchers, the run's config has no rehearsal group, agrpo's own flags (`--rehearse`, `--rehearsal-dir`, ...) choose
it, the product names it in one place (agrpo/launchers/hf_jobs/hub.py), and the old config spellings still work from
the command line, each with a note that it is deprecated."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.errors import ConfigError
from agrpo.rehearsal.backend import DEPRECATED_KEYS, RehearsalSettings, rehearsal_flags
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


def test_the_product_imports_the_rehearsal_in_one_place():
    """Outside agrpo/rehearsal only the module that picks the Hub backend imports it (tests and docs aside)."""
    importers = set()
    for module in sorted((REPO / "agrpo").rglob("*.py")):
        if module.parent.name == "rehearsal":
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agrpo.rehearsal"):
                importers.add(str(module.relative_to(REPO)))
            if isinstance(node, ast.Import) and any(a.name.startswith("agrpo.rehearsal") for a in node.names):
                importers.add(str(module.relative_to(REPO)))
    assert importers == {"agrpo/launchers/hf_jobs/hub.py"}


def test_the_run_config_has_no_rehearsal_knob():
    cfg = compose_run_config([])
    assert "rehearsal" not in cfg and not any(key.startswith("rehearse") for key in cfg.launcher.hf_jobs)
    for override in ("rehearsal.enabled=true", "launcher.hf_jobs.rehearse=true", "rehearsal.dir=/tmp/r"):
        with pytest.raises(Exception, match="rehears"):
            compose_run_config([override])


def test_the_flags_leave_argv_and_become_the_backends_settings():
    argv = ["+recipe=smoke", "--rehearse", "--rehearsal-dir", "/r", "-m", "--rehearsal-listing-lag-s=2", "lora.r=1,8"]
    settings, rest, notes = rehearsal_flags(argv)
    assert settings == RehearsalSettings(listing_lag_s=2.0, negative_cache_s=30.0, dir="/r")
    assert rest == ["+recipe=smoke", "-m", "lora.r=1,8"] and notes == []
    assert rehearsal_flags(["+recipe=smoke", "launcher=hf_jobs"]) == (None, ["+recipe=smoke", "launcher=hf_jobs"], [])
    assert rehearsal_flags(["--rehearse"])[0] == RehearsalSettings()  # the defaults: lag 1 s, cache 30 s, temp dir


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rehearsal-dir", "/r"], "--rehearsal-dir set without --rehearse"),
        (["--rehearse", "--rehearsal-negative-cache-s=soon"], "--rehearsal-negative-cache-s='soon' must be a number"),
        (["--rehearse", "--rehearsal-listing-lag-s=-1"], "--rehearsal-listing-lag-s='-1' must be a number"),
        (["--rehearse", "--rehearsal-dir"], "--rehearsal-dir needs a value"),
        (["rehearsal.enabled=maybe"], "rehearsal.enabled='maybe' is not true or false"),
    ],
)
def test_a_bad_flag_is_one_config_error_naming_it(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        rehearsal_flags(argv)
    assert error.value.exit_code == 2


def test_old_spellings_are_read_as_the_flags_with_a_deprecation_note():
    old = ["+recipe=smoke", "launcher.hf_jobs.rehearse=true", "rehearsal.dir=/r", "rehearsal.negative_cache_s=5"]
    settings, rest, notes = rehearsal_flags(old)
    assert settings == RehearsalSettings(negative_cache_s=5.0, dir="/r") and rest == ["+recipe=smoke"]
    assert notes[0] == (
        "launcher.hf_jobs.rehearse=true is deprecated (the rehearsal is not a config key any more): read as --rehearse"
    )
    assert notes[1].endswith("read as --rehearsal-dir /r") and len(notes) == 3
    assert rehearsal_flags(["rehearsal.enabled=false", "x=1"])[:2] == (None, ["x=1"])
    assert set(DEPRECATED_KEYS) >= {"rehearsal.enabled", "rehearsal.dir", "rehearsal.listing_lag_s"}


def test_the_old_command_still_plans_a_rehearsal(tmp_path):
    new_to_old = {
        "--rehearse": "rehearsal.enabled=true",
        f"--rehearsal-dir={tmp_path / 'r'}": f"rehearsal.dir={tmp_path / 'r'}",
    }
    command = [new_to_old.get(arg, arg) for arg in rehearsal_command(tmp_path / "r", "old")]
    assert "rehearsal.enabled=true" in command and "--rehearse" not in command
    done = run_cli([*command, "inference.device=cpu", "launcher.dry_run=true"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rehearsal.enabled=true is deprecated" in done.stderr
    assert "rehearse (--rehearse): every Job below runs on this machine" in done.stdout
    assert str(tmp_path / "r") in done.stdout


def run_cli(argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=rehearsal_env(), capture_output=True, text=True, timeout=300)


def test_the_flag_with_another_launcher_is_one_paragraph_and_exit_2(tmp_path):
    done = run_cli([*rehearsal_command(tmp_path / "r", "local")[:4], "--rehearse", "launcher.dry_run=true"], tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "agrpo: error: --rehearse chooses where a launcher=hf_jobs plan runs" in done.stderr
    assert "launcher=local" in done.stderr and "Traceback" not in done.stderr
