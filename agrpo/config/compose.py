"""Compose the run config in Python exactly as the CLI does (tests, notebooks, tools)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from agrpo.config.schema import register_configs
from agrpo.errors import ConfigError
from agrpo.paths import CONF_DIR, register_resolvers


def compose_run_config(overrides: list[str], output_dir: str | None = None) -> DictConfig:
    """The composed config for `overrides` (e.g. ["+recipe=smoke", "lora.r=4"]). Outside a Hydra run there is no
    run directory, so pass `output_dir` (sets sync.output_dir) when the config will be resolved."""
    register_configs()
    register_resolvers()
    extra = [f"sync.output_dir={output_dir}"] if output_dir else []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, *extra])


def estimate_run_dir() -> str:
    """The run directory a config-only command (an estimate, a card) composes with: a name under this user's private
    runtime base, never created, since nothing is written; not a fixed /tmp name another user could take first."""
    from agrpo.processes.private_dir import runtime_base

    return str(runtime_base() / "estimate")


def compose_overrides(overrides: list[str], output_dir: str | None = None) -> DictConfig:
    """The composed config of command-line overrides, for entrypoints outside Hydra's main (`+recipe=` takes a
    YAML path too). Outside a Hydra run there is no run directory: `output_dir` stands in for it unless the overrides
    set sync.output_dir. A key or value Hydra refuses is a ConfigError (exit 2) naming the override."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from agrpo.config.recipe_files import expand_recipe_paths

    expanded = expand_recipe_paths(list(overrides))
    if any(override.partition("=")[0].lstrip("+~") == "sync.output_dir" for override in expanded):
        output_dir = None
    try:
        return compose_run_config(expanded, output_dir=output_dir)
    except (HydraException, OmegaConfBaseException) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise ConfigError(f"invalid override: {' '.join(lines[:2])}") from None
