"""Every recipe composes against the real conf/ tree; struct mode rejects unknown keys; validation names keys."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems, validate
from agrpo.errors import ConfigError
from agrpo.paths import RECIPES_DIR

RECIPES = sorted(p.stem for p in Path(RECIPES_DIR).glob("*.yaml"))
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_recipes_exist():
    assert {"smoke", "gsm8k"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_resolves_and_validates(recipe, monkeypatch):
    monkeypatch.setenv("AGRPO_DATA_DIR", str(SHARED_DATA))  # gsm8k_cpu reads ${data_dir}/gsm8k/train.jsonl
    cfg = compose_run_config([f"+recipe={recipe}"], output_dir="/tmp/agrpo-compose")
    OmegaConf.resolve(cfg)  # every interpolation resolves
    validate(cfg)
    assert cfg.run_name == recipe
    assert cfg.reward.funcs, "a recipe must have a reward"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_starts_with_its_command(recipe):
    lines = (Path(RECIPES_DIR) / f"{recipe}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_"
    command = f"# python -m agrpo +recipe={recipe}"
    assert lines[1] == command or lines[1].startswith(f"{command} ")
    assert lines[2].startswith("# Hardware:")


def test_smoke_recipe_values_override_defaults():
    cfg = compose_run_config(["+recipe=smoke"], output_dir="/tmp/x")
    assert cfg.model.builder == "agrpo.models.tiny.build_tiny_model"
    assert cfg.trainer.max_steps == 60
    assert cfg.trainer.weight_sync_steps == 1  # schema default, untouched by the recipe
    assert cfg.reward.funcs[0]["_target_"] == "agrpo.rewards.smoke.lowercase_fraction"


def test_command_line_override_wins_over_recipe():
    cfg = compose_run_config(["+recipe=smoke", "trainer.max_steps=3", "lora.r=4"], output_dir="/tmp/x")
    assert (cfg.trainer.max_steps, cfg.lora.r) == (3, 4)


def test_data_dir_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AGRPO_DATA_DIR", "/data/here")
    assert compose_run_config(["+recipe=gsm8k_cpu"], output_dir="/tmp/x").data.path == "/data/here/gsm8k/train.jsonl"
    monkeypatch.delenv("AGRPO_DATA_DIR")
    assert compose_run_config(["+recipe=smoke"], output_dir="/tmp/x").data_dir is None


def test_unknown_key_fails():
    with pytest.raises(ConfigCompositionException, match="no_such_knob"):
        compose_run_config(["+recipe=smoke", "trainer.no_such_knob=1"])


def test_wrong_type_fails():
    with pytest.raises(ConfigCompositionException, match="max_steps"):
        compose_run_config(["+recipe=smoke", "trainer.max_steps=lots"])


def smoke(*overrides):
    return compose_run_config(["+recipe=smoke", *overrides], output_dir="/tmp/x")


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["inference.max_loras=2", "trainer.max_staleness=1"], ["inference.max_loras", "trainer.max_staleness"]),
        (["lora.r=16", "inference.max_lora_rank=8"], ["lora.r", "inference.max_lora_rank"]),
        (["lora.use_dora=true"], ["lora.use_dora"]),
        (["lora.modules_to_save=[lm_head]"], ["lora.modules_to_save"]),
        (["lora.target_modules=[q_proj,lm_head]"], ["lora.target_modules"]),
        (["trainer.max_completion_length=256"], ["trainer.max_completion_length", "inference.max_model_len"]),
        (["trainer.num_generations=1"], ["trainer.num_generations"]),
        (["inference.replicas=0"], ["inference.replicas"]),
        (["inference.device=tpu"], ["inference.device"]),
        (["role=trainer"], ["inference.urls"]),
        (["sync.kind=ftp"], ["sync.kind"]),
        (["reward.funcs=[]"], ["reward.funcs"]),
    ],
)
def test_validation_names_the_keys_to_change(overrides, keys):
    problems = find_problems(smoke(*overrides))
    assert len(problems) == 1, problems
    for key in keys:
        assert key in problems[0]


def test_validate_lists_every_problem_in_one_error():
    with pytest.raises(ConfigError) as error:
        validate(smoke("lora.use_dora=true", "inference.replicas=0"))
    assert "2 problems" in str(error.value)
    assert "lora.use_dora" in str(error.value) and "inference.replicas" in str(error.value)


def test_max_loras_exactly_staleness_plus_two_is_valid():
    assert find_problems(smoke("inference.max_loras=3", "trainer.max_staleness=1")) == []
