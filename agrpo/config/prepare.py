"""compose -> validate -> resolve: the one way a run config becomes the config every part of agrpo reads.

Every entrypoint goes through `prepare`: `python -m agrpo` (agrpo/cli.py, after Hydra composed), `agrpo eval`
(agrpo/eval/cli.py), launchers/serve_replica.py and the trainer Job (agrpo/launchers/hf_jobs/trainer.py). So a bad
override gets the same one-paragraph ConfigError (exit 2) everywhere, and downstream code reads resolved values
(device, dtype, served LoRA rank and count, proxy or not, queue size, eval's max tokens) instead of deriving them.
`agrpo plot` and `agrpo push` read a finished run's `config.yaml`, which this step already resolved.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from agrpo.errors import ConfigError


def machine_has_cuda(cfg: Any) -> bool:
    """Whether the run's replicas and trainer have CUDA: HF Jobs always do (a rehearsal runs the Jobs on this
    machine); otherwise this machine decides. The one machine fact `resolve` needs."""
    if cfg.launcher.name == "hf_jobs" and cfg.role == "all" and not cfg.rehearsal.enabled:
        return True
    import torch

    return torch.cuda.is_available()


def prepare(
    cfg: Any, check_environment: bool = True, training_data: bool = True, cuda_available: bool | None = None
) -> DictConfig:
    """Validate `cfg` (one ConfigError listing every problem) and return it resolved. `check_environment=False`
    skips the checks against this machine (a replica node needs no data, rewards or trainer packages);
    `training_data=False` skips the training data's (`agrpo eval` opens its test problems itself)."""
    from agrpo.config.resolve import resolve
    from agrpo.config.validate import validate

    validate(cfg, check_environment=check_environment, training_data=training_data)
    return resolve(cfg, cuda_available=machine_has_cuda(cfg) if cuda_available is None else cuda_available)


def compose_overrides(overrides: list[str], output_dir: str | None = None) -> DictConfig:
    """The composed config of command-line overrides, for entrypoints outside Hydra's main (`+recipe=` takes a
    YAML path too). Outside a Hydra run there is no run directory: `output_dir` stands in for it unless the overrides
    set sync.output_dir. A key or value Hydra refuses is a ConfigError (exit 2) naming the override."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from agrpo.config.compose import compose_run_config
    from agrpo.config.recipe_files import expand_recipe_paths

    expanded = expand_recipe_paths(list(overrides))
    if any(override.partition("=")[0].lstrip("+~") == "sync.output_dir" for override in expanded):
        output_dir = None
    try:
        return compose_run_config(expanded, output_dir=output_dir)
    except (HydraException, OmegaConfBaseException) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise ConfigError(f"invalid override: {' '.join(lines[:2])}") from None


def prepare_overrides(overrides: list[str], output_dir: str | None = None, check_environment: bool = True):
    """compose -> validate -> resolve in one call."""
    return prepare(compose_overrides(overrides, output_dir), check_environment=check_environment)
