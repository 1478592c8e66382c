"""Compose the run config in Python exactly as the CLI does (tests, notebooks, tools)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from agrpo.config.schema import register_configs
from agrpo.paths import CONF_DIR, register_resolvers


def compose_run_config(overrides: list[str], output_dir: str | None = None) -> DictConfig:
    """The composed config for `overrides` (e.g. ["+recipe=smoke", "lora.r=4"]). Outside a Hydra run there is no
    run directory, so pass `output_dir` (sets sync.output_dir) when the config will be resolved."""
    register_configs()
    register_resolvers()
    extra = [f"sync.output_dir={output_dir}"] if output_dir else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, *extra])
