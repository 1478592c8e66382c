"""The one validation pass: every bad value fails before anything starts, naming the key and the real options.

In process through `validate(cfg)` for every value, and through `python -m agrpo` for a few, with and without
`launcher.dry_run=true`: exit code 2, one paragraph, no traceback, no replica log in the run dir.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import validate
from agrpo.errors import ConfigError

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def problems_of(*overrides):
    """The ConfigError message for the smoke recipe with `overrides` (fails the test when the config is valid)."""
    cfg = compose_run_config(["+recipe=smoke", *overrides], output_dir="/tmp/agrpo-validate")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    return str(error.value)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        # struct mode: `+` adds keys the schema does not have
        (["+trainer.bogus=1"], ["trainer.bogus is not a config key"]),
        (["+bogus=1"], ["bogus is not a config key"]),
        (["+trainer.learning_rat=1e-5"], ["did you mean trainer.learning_rate?"]),
        # numeric ranges
        (["trainer.learning_rate=-1e-5"], ["trainer.learning_rate=-1e-05 must be > 0"]),
        (["trainer.per_device_train_batch_size=-4"], ["trainer.per_device_train_batch_size=-4 must be >= 1"]),
        (["trainer.gradient_accumulation_steps=0"], ["trainer.gradient_accumulation_steps=0"]),
        (["lora.r=0"], ["lora.r=0 must be >= 1"]),
        (["lora.dropout=1.5"], ["lora.dropout=1.5"]),
        (["trainer.top_p=2"], ["trainer.top_p=2.0 must be in (0, 1]"]),
        (["trainer.top_p=0"], ["trainer.top_p=0.0"]),
        (["trainer.temperature=0"], ["trainer.temperature=0.0 must be > 0"]),
        (["trainer.max_inflight_tasks=0"], ["trainer.max_inflight_tasks=0"]),
        (["trainer.max_inflight_tasks=lots"], ["trainer.max_inflight_tasks=lots must be >= 1 or auto"]),
        (["sync.mode=eager"], ["sync.mode=eager must be one of background | blocking"]),
        (["inference.gpu_memory_utilization=1.5"], ["inference.gpu_memory_utilization=1.5"]),
        (["inference.base_port=70000"], ["inference.base_port=70000"]),
        (["eval.k=0"], ["eval.k=0"]),
        (["logger.level=LOUD"], ["logger.level='LOUD'"]),
        # the proxy's own checks, as proxy.* keys
        (["proxy.spill_factor=0.5"], ["proxy.spill_factor below 1"]),
        (["proxy.block_size=0"], ["proxy.block_size must be at least 1"]),
        (["proxy.health_quorum=3"], ["proxy.health_quorum 3 exceeds the 1 replicas"]),
        # names of real options
        (
            ["launcher.name=nosuch"],
            ["launcher.name='nosuch'", "launcher=accelerate", "launcher=hf_jobs", "launcher=local"],
        ),
        (["sync.kind=ftp"], ["sync.kind='ftp'", "sync=bucket", "sync=shared_dir"]),
        (["logger.report_to=[tensorbored]"], ["logger.report_to has 'tensorbored'", "tensorboard", "wandb"]),
        # code a config names must import and be callable
        (
            ["reward.funcs=[{_target_:agrpo.rewards.smoke.lowercase_fractio,weight:1.0}]"],
            [
                "reward.funcs[0]._target_='agrpo.rewards.smoke.lowercase_fractio' cannot be imported",
                "did you mean agrpo.rewards.smoke.lowercase_fraction?",
            ],
        ),
        (["reward.funcs=[{_target_:nosuchpkg.reward}]"], ["reward.funcs[0]._target_", "no module named 'nosuchpkg'"]),
        (["reward.funcs=[{_target_:agrpo.data.smoke.WORDS}]"], ["agrpo.data.smoke.WORDS' is a tuple, not a callable"]),
        (["data.loader=agrpo.data.nosuch.load"], ["data.loader='agrpo.data.nosuch.load'", "agrpo.data has: ", "smoke"]),
        # files and packages on this machine
        (["data.path=/nonexistent/train.jsonl"], ["data.path='/nonexistent/train.jsonl' does not exist"]),
        (["+trainer.extra.learning_rate=1.0"], ["trainer.extra sets ['learning_rate']", "trainer.learning_rate"]),
    ],
)
def test_bad_value_is_reported_with_its_key(overrides, fragments):
    message = problems_of(*overrides)
    assert message.startswith("invalid config (1 problem)"), message
    for fragment in fragments:
        assert fragment in message, message


def test_every_problem_is_listed_at_once():
    message = problems_of("lora.r=0", "trainer.top_p=2", "proxy.block_size=0")
    assert message.startswith("invalid config (3 problems)")


def test_unknown_trl_field_in_trainer_extra():
    message = problems_of("+trainer.extra.top_k=20", "+trainer.extra.no_such_trl_field=1")
    assert "trainer.extra.no_such_trl_field is not a field of TRL's AsyncGRPOConfig" in message
    assert "top_k" not in message  # a real AsyncGRPOConfig field passes


def test_logger_package_missing_gives_the_pip_command(monkeypatch):
    from agrpo.config import environment
    from agrpo.config.ranges import INTEGRATIONS

    missing = sorted(INTEGRATIONS)[0]  # whatever is installed here, this one is made to look missing
    monkeypatch.setattr(environment, "module_exists", lambda module: module != INTEGRATIONS[missing][0])
    message = problems_of(f"logger.report_to=[{missing}]")
    assert f"pip install {INTEGRATIONS[missing][1]}" in message and "logger.report_to" in message


def test_cuda_requested_on_a_machine_without_it(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine runs it too
    assert "inference.device=cuda but this machine has no CUDA GPU" in problems_of("inference.device=cuda")


def test_unset_data_dir_names_both_ways_to_set_it(monkeypatch):
    monkeypatch.delenv("AGRPO_DATA_DIR", raising=False)
    cfg = compose_run_config(["+recipe=gsm8k_cpu"], output_dir="/tmp/agrpo-validate")
    with pytest.raises(ConfigError, match=r"needs data_dir, which is not set: pass data_dir=.* AGRPO_DATA_DIR"):
        validate(cfg)


def test_data_dir_without_the_data_names_both(monkeypatch, tmp_path):
    monkeypatch.setenv("AGRPO_DATA_DIR", str(tmp_path))
    cfg = compose_run_config(["+recipe=gsm8k_cpu"], output_dir="/tmp/agrpo-validate")
    with pytest.raises(ConfigError, match=r"data.path=.*does not exist \(it is under data_dir=.*AGRPO_DATA_DIR"):
        validate(cfg)


@pytest.mark.parametrize("recipe", ["smoke", "gsm8k", "gsm8k_cpu", "sanity"])
def test_shipped_recipes_pass(recipe, monkeypatch):
    monkeypatch.setenv("AGRPO_DATA_DIR", str(SHARED_DATA))
    validate(compose_run_config([f"+recipe={recipe}"], output_dir="/tmp/agrpo-validate"))


BAD_COMMAND_LINES = [
    ("+trainer.bogus=1", "trainer.bogus"),
    ("proxy.spill_factor=0.5", "proxy.spill_factor"),
    ("launcher.name=nosuch", "launcher=local"),
    ("trainer.top_p=2", "trainer.top_p"),
    ("data.path=/nonexistent/train.jsonl", "data.path"),
    ("reward.funcs=[{_target_:agrpo.rewards.smoke.nope}]", "reward.funcs[0]._target_"),
]


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "real_run"])
@pytest.mark.parametrize(("override", "key"), BAD_COMMAND_LINES)
def test_cli_fails_before_anything_starts(override, key, dry_run, tmp_path):
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "agrpo", "+recipe=smoke", override, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(
        [*argv, *(["launcher.dry_run=true"] if dry_run else [])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "AGRPO_CACHE": str(tmp_path / "cache")},
    )
    assert result.returncode == 2, result.stderr
    assert key in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one paragraph
    assert "[replica]" not in result.stdout  # no plan printed either
    assert not (run_dir / "logs").exists() and not (tmp_path / "cache").exists()  # no replica, no model built


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("None/gsm8k/train.jsonl", "built from data_dir, which is not set"),
        ("/nonexistent/train.jsonl", "does not exist"),
    ],
)
def test_data_loading_names_data_path_and_data_dir(path, fragment):
    """The trainer's own loading (a config that skipped validation) fails with the same keys, not a traceback."""
    from omegaconf import OmegaConf

    from agrpo.data.loading import load_train_dataset

    data_cfg = OmegaConf.create(
        {"loader": "agrpo.data.math.load_math", "path": path, "shuffle": False, "max_prompts": None}
    )
    with pytest.raises(ConfigError, match=fragment) as error:
        load_train_dataset(data_cfg, seed=0)
    assert "AGRPO_DATA_DIR" in str(error.value) and "data.path" in str(error.value)


def test_a_reward_given_as_a_file_path_validates_as_the_trainer_loads_it(tmp_path):
    """`_target_: path/to/file.py:function` is how a user's own reward is named without a package (docs/your_task.md):
    validation must accept what the trainer accepts, and name the file when it is missing."""
    (tmp_path / "mine.py").write_text("def score(completions, **kwargs):\n    return [1.0] * len(completions)\n")
    good = compose_run_config(
        ["+recipe=smoke", f"reward.funcs=[{{_target_: '{tmp_path}/mine.py:score'}}]"], output_dir=str(tmp_path / "run")
    )
    validate(good)
    bad = compose_run_config(
        ["+recipe=smoke", f"reward.funcs=[{{_target_: '{tmp_path}/gone.py:score'}}]"], output_dir=str(tmp_path / "run")
    )
    with pytest.raises(ConfigError, match=r"reward.funcs\[0\]._target_=.*gone.py:score.*cannot be loaded"):
        validate(bad)
