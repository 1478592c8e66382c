"""Choice fields are StrEnums in the schema (agrpo/config/schema/choices.py): a bad name gets the validation pass's
one-paragraph message naming the key, a prepared config holds the members, and every file a run writes from it
(the run dir's config.yaml, the trainer Job's uploaded config) holds plain strings that read back into the schema."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import FrozenInstanceError
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.config.schema import Choice, LogLevel, MixedPrecision, RunConfig, SyncMode, choice_fields
from agrpo.config.spec import as_dict, load_spec, with_values
from agrpo.config.validate import find_problems

REPO_ROOT = Path(__file__).resolve().parents[2]
# Keys whose check needs the launcher it belongs to.
NEEDS = {"launcher.hf_jobs.trainer_launcher": ["launcher=hf_jobs", "sync=bucket"]}


def smoke(*overrides, output_dir="/tmp/agrpo-choices"):
    return compose_run_config(["+recipe=smoke", *overrides], output_dir=output_dir)


def test_member_names_are_their_text():
    """OmegaConf converts by member name and writes the name: name == value keeps YAML and overrides in text."""
    for enum in {*choice_fields(RunConfig).values(), *Choice.__subclasses__()}:
        assert [member.name for member in enum] == list(enum.values()), enum
        assert all(type(text) is str for text in enum.values())


@pytest.mark.parametrize("key", sorted(choice_fields(RunConfig)))
def test_a_bad_name_is_one_problem_naming_the_key(key):
    """Hydra composes the choice fields as text, so the bad name reaches the validation pass: one problem, naming the
    key and the value (whichever module checks it), beside whatever else the config has."""
    base = find_problems(smoke(*NEEDS.get(key, [])))
    problems = find_problems(smoke(*NEEDS.get(key, []), f"{key}=nosuch"))
    new = [problem for problem in problems if problem not in base]
    assert len(new) == 1 and new[0].startswith(f"{key}=") and "nosuch" in new[0] and "must be" in new[0], new


def test_a_composed_config_holds_text_and_a_prepared_one_members(tmp_path):
    composed = smoke("logger.level=debug", output_dir=str(tmp_path))
    assert type(composed.sync.mode) is str and composed.logger.level == "debug"
    prepared = prepare(composed, check_environment=False)
    assert prepared.sync.mode is SyncMode.background and prepared.sync.mode == "background"
    assert prepared.logger.level is LogLevel.DEBUG  # any case names the level, as logging takes it
    assert prepared.launcher.accelerate.mixed_precision is MixedPrecision.bf16
    assert f"{prepared.sync.mode}" == "background" and json.dumps(prepared.sync.mode) == '"background"'
    with pytest.raises(FrozenInstanceError):
        prepared.sync.mode = "eager"  # the spec is frozen: a value changes by with_values, typed
    with pytest.raises(ValueError, match="'eager' is not a valid SyncMode"):
        with_values(prepared, {"sync.mode": "eager"})
    assert with_values(prepared, {"sync.mode": "blocking"}).sync.mode is SyncMode.blocking


def plain_strings(values, path=""):
    """Every (key, value) whose value is a str subclass and not a plain str."""
    if isinstance(values, dict):
        return [bad for key, value in values.items() for bad in plain_strings(value, f"{path}{key}.")]
    if isinstance(values, list):
        return [bad for value in values for bad in plain_strings(value, path)]
    return [(path, values)] if isinstance(values, str) and type(values) is not str else []


def test_the_run_dirs_config_yaml_is_text_and_reads_back(tmp_path):
    """LocalLauncher writes <run_dir>/config.yaml from the prepared spec; the trainer process loads it back
    (load_spec: agrpo/trainer/__main__.py) and gets the same spec, members again."""
    from agrpo.launchers.local import RESOLVED_CONFIG, LocalLauncher

    prepared = prepare(smoke("inference.device=cpu", "logger.level=warning", output_dir=str(tmp_path)))
    text = LocalLauncher().build_plan(prepared).files[RESOLVED_CONFIG]  # building reserves nothing
    saved = yaml.safe_load(text)
    assert saved["sync"]["mode"] == "background" and saved["logger"]["level"] == "WARNING"
    assert saved["role"] == "all" and saved["trainer"]["attention"] == "sdpa"
    (tmp_path / "config.yaml").write_text(text)
    read = load_spec(tmp_path / "config.yaml")
    assert read.logger.level is LogLevel.WARNING and read.sync.mode is SyncMode.background
    assert read == prepared  # every value, as prepare resolved it
    assert json.loads(json.dumps(dataclasses.asdict(prepared)))["inference"]["dtype"] == "float32"
    assert plain_strings(as_dict(prepared)) == []


def test_the_trainer_jobs_config_is_text_and_plans(tmp_path):
    """The config uploaded for the trainer Job (planner.job_config_text) holds plain strings, and the Job's own plan
    (in_job_processes, as the trainer Job reads it) is built from it."""
    from agrpo.launchers.hf_jobs.planner import in_job_processes, job_config_text

    cfg = smoke(
        "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.trainer_launcher=accelerate", output_dir="/bucket/r"
    )
    text = job_config_text(prepare(cfg, check_environment=False, cuda_available=True), "ns", "ns/runs")
    uploaded = yaml.safe_load(text)
    assert plain_strings(uploaded) == []
    assert uploaded["role"] == "trainer" and uploaded["launcher"]["hf_jobs"]["trainer_launcher"] == "accelerate"
    processes = in_job_processes(text, replicas=2)
    assert "accelerate" in processes[-1].name


def test_the_cli_refuses_a_bad_name_with_exit_2(tmp_path):
    """The user's way: the override through `python -m agrpo`, dry run; one paragraph naming the key, no traceback."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "agrpo", "+recipe=smoke", "launcher.accelerate.mixed_precision=fp7", "lora.r=0"]
        + ["launcher.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "invalid config (2 problems)" in result.stderr and "Traceback" not in result.stderr
    assert "launcher.accelerate.mixed_precision='fp7' must be one of no | fp16 | bf16 | fp8" in result.stderr
    assert "lora.r=0 must be >= 1" in result.stderr  # listed beside it, in one go


def test_a_composed_config_pickles_into_a_fresh_interpreter(tmp_path):
    """Hydra's composable copy of the schema has a home (agrpo/config/schema/knobs.py), so a composed config pickles
    (sweep launchers that ship configs to workers do) and unpickles where nothing composed yet."""
    import pickle

    composed = smoke(output_dir=str(tmp_path))
    assert pickle.loads(pickle.dumps(composed)) == composed
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(composed))
    probe = (
        f"import pickle; cfg = pickle.load(open({str(tmp_path / 'cfg.pkl')!r}, 'rb')); print(cfg.sync.mode, cfg.role)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["background", "all"], result.stderr
