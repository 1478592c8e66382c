"""The smoke dataset and the shared loading step (shuffle, cap, prompt column check)."""

import pytest
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.data import load_train_dataset
from agrpo.data.smoke import smoke_prompts
from agrpo.errors import ConfigError


def test_smoke_prompts_are_distinct_and_deterministic():
    prompts = smoke_prompts(50, seed=1)
    assert len(set(prompts)) == 50
    assert prompts == smoke_prompts(50, seed=1)


def test_loader_returns_chat_prompts_capped():
    cfg = compose_run_config(["+recipe=smoke", "data.max_prompts=10", "data.system_prompt=Be brief."])
    dataset = load_train_dataset(cfg.data, seed=0)
    assert len(dataset) == 10
    first = dataset[0]["prompt"]
    assert first[0] == {"role": "system", "content": "Be brief."}
    assert first[1]["role"] == "user" and "lowercase" in first[1]["content"]


def test_loader_without_prompt_column_is_rejected():
    data_cfg = OmegaConf.create(
        {"loader": "agrpo.data.smoke.smoke_prompts_as_text", "shuffle": False, "max_prompts": None}
    )
    with pytest.raises(ConfigError, match="cannot be imported"):
        load_train_dataset(data_cfg, seed=0)
