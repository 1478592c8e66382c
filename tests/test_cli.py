"""The entrypoint as a user runs it: dry run from another directory, recipe by path, --cfg job, bad input."""

import os
import sys
from pathlib import Path

import pytest

from tests.processes import Drained, agrpo, left_behind

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_from_any_directory_prints_plan_and_starts_nothing(tmp_path):
    result = agrpo("+recipe=smoke", "launcher.dry_run=true", "inference.replicas=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("[replica]") == 2 and "[proxy]" in out and "[trainer]" in out
    assert "vllm.entrypoints.openai.api_server" in out and "--enable-lora" in out
    assert "-m agrpo.proxy" in out
    # the run directory is under the caller's working directory, and a dry run leaves no run folder behind
    assert f"run dir {tmp_path / 'outputs' / 'smoke'}/" in out and not (tmp_path / "outputs").exists()


def test_recipe_given_as_a_path_to_the_users_yaml(tmp_path):
    mine = tmp_path / "my_recipe.yaml"
    mine.write_text(
        "# @package _global_\n# python -m agrpo +recipe=./my_recipe.yaml\n"
        "defaults:\n  - /recipe/smoke\n\nrun_name: mine\ntrainer:\n  max_steps: 7\n"
    )
    result = agrpo("+recipe=./my_recipe.yaml", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "run_name: mine" in result.stdout and "max_steps: 7" in result.stdout
    assert "lowercase_fraction" in result.stdout  # inherited from the smoke recipe


def test_cfg_job_prints_the_composed_config(tmp_path):
    result = agrpo("+recipe=smoke", "lora.r=4", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "r: 4" in result.stdout and "learning_rate:" in result.stdout


def test_invalid_override_fails_with_a_short_message(tmp_path):
    result = agrpo("+recipe=smoke", "trainer.learning_rat=1e-5", cwd=tmp_path)
    assert result.returncode != 0
    assert "learning_rat" in result.stderr
    assert "Traceback" not in result.stderr


def test_cross_field_error_names_the_keys_and_exits_2(tmp_path):
    result = agrpo("+recipe=smoke", "inference.max_loras=2", cwd=tmp_path)
    assert result.returncode == 2
    assert "inference.max_loras" in result.stderr and "trainer.max_staleness" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one paragraph


def test_missing_model_path_fails_before_starting_anything(tmp_path):
    result = agrpo("+recipe=smoke", "model.builder=null", f"model.name_or_path={tmp_path}/no-such-model", cwd=tmp_path)
    assert result.returncode == 2
    assert "no-such-model" in result.stderr and "config.json" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.rglob("vllm-0.log"))  # no replica was started


def test_missing_recipe_file(tmp_path):
    result = agrpo("+recipe=./nope.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "nope.yaml" in result.stderr


@pytest.mark.vllm
def test_replica_that_fails_to_start_shows_its_log_and_leaves_nothing_running(tmp_path, run_token):
    """A real vLLM start that fails (the engine rejects the flags): clear error with the log tail, no orphans."""
    result = agrpo("+recipe=smoke", "inference.extra_args=[--max-num-seqs,-5]", cwd=tmp_path, timeout=600)
    assert result.returncode == 1
    assert "vllm-0 exited with code" in result.stderr
    assert "Last lines of" in result.stderr
    assert "Traceback (most recent call last)" not in result.stderr.split("Last lines of")[0]
    assert left_behind(run_token) == {}  # by the run's marker: vLLM's renamed engine core included


@pytest.mark.vllm
def test_ctrl_c_while_a_replica_starts_stops_everything(tmp_path, run_token):
    """SIGINT (Ctrl-C) reaches the launcher only (children run in their own process groups); it must stop them."""
    import signal
    import time

    run_dir = tmp_path / "run"
    # A terminal's Ctrl-C: when pytest itself runs as a background job, SIGINT is ignored and the child would inherit
    # that (Python then never raises KeyboardInterrupt), so restore the default in the child.
    proc = Drained(  # its output read as it comes (tests/processes.py)
        [sys.executable, "-m", "agrpo", "+recipe=smoke", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "AGRPO_CACHE": str(tmp_path / "cache")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = run_dir / "logs" / "vllm-0.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and log.stat().st_size > 0):
        time.sleep(0.5)
    assert log.exists(), "the replica never started"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "interrupted; every process was stopped" in stderr
    assert left_behind(run_token) == {}  # every process carrying the run's marker, vLLM's renamed children included


def test_user_recipe_named_like_a_shipped_one_and_without_header(tmp_path):
    """./smoke.yaml building on the shipped smoke recipe: the user's file is used, the header is optional, and no
    temp folder is left behind."""
    (tmp_path / "smoke.yaml").write_text("defaults:\n  - /recipe/smoke\n\nrun_name: smokey\nlora:\n  r: 2\n")
    (tmp_path / "tmp").mkdir()
    result = agrpo("+recipe=./smoke.yaml", "--cfg", "job", cwd=tmp_path, env={"TMPDIR": str(tmp_path / "tmp")})
    assert result.returncode == 0, result.stderr
    assert "run_name: smokey" in result.stdout and "lowercase_fraction" in result.stdout
    assert not list((tmp_path / "tmp").iterdir())


def test_version_prints_agrpos_own(tmp_path):
    from agrpo import __version__

    result = agrpo("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == f"agrpo {__version__}"


def test_bad_recipe_yaml_is_one_paragraph(tmp_path):
    (tmp_path / "broken.yaml").write_text("trainer: [unclosed\n")
    result = agrpo("+recipe=./broken.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "broken.yaml" in result.stderr and "Traceback" not in result.stderr


def test_help_describes_the_commands_and_lists_the_groups(tmp_path):
    result = agrpo("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "powered by Hydra" not in result.stdout
    for text in (
        "python -m agrpo +recipe=NAME",
        "agrpo eval",
        "agrpo plot",
        "agrpo push",
        "agrpo jobs",
        "local, accelerate, hf_jobs",
        "how processes start",
        "gsm8k, gsm8k_cpu, sanity, smoke",
    ):
        assert text in result.stdout, text
    assert agrpo("+recipe=smoke", "--help", cwd=tmp_path).stdout == result.stdout  # anywhere on the line


def test_every_group_of_the_defaults_list_has_a_description():
    from pathlib import Path

    from agrpo.help import group_lines, options
    from agrpo.paths import CONF_DIR

    lines = group_lines((Path(CONF_DIR) / "config.yaml").read_text())
    groups = {group for group, _, _ in lines}
    assert groups == {"model", "lora", "data", "reward", "agent", "trainer", "inference", "sync", "launcher", "logger"}
    for group, default, why in lines:
        assert default in options(Path(CONF_DIR), group) and len(why) > 10, (group, default, why)
