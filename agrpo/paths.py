"""Where the project's config lives (inside the installed package), and the OmegaConf resolvers the config uses.

The YAML tree ships as `agrpo/conf` (in a checkout a link to the top-level conf/, whose recipe/ links to recipes/;
in a wheel real files), so Hydra reads it through the package from any working directory and any install.
"""

from __future__ import annotations

import os
import secrets
from importlib.resources import files
from pathlib import Path

from omegaconf import OmegaConf

CONF_DIR = Path(str(files("agrpo") / "conf"))
RECIPES_DIR = CONF_DIR / "recipe"


def run_dir() -> str:
    """`${agrpo_run_dir:}`: the run's output directory. Hydra knows it once the job runs; `--cfg job` prints the
    config before that (runtime.output_dir is None there), so show where a run would write instead."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None, throw_on_missing=False)
    if output_dir:
        return str(output_dir)
    from hydra.types import RunMode

    if hydra_cfg.mode == RunMode.MULTIRUN:
        return os.path.abspath(str(hydra_cfg.sweep.dir))
    return os.path.abspath(str(hydra_cfg.run.dir))


def register_resolvers() -> None:
    """Resolvers the shipped YAML refers to; registered before any compose (CLI, compose API)."""
    if not OmegaConf.has_resolver("agrpo_run_dir"):
        OmegaConf.register_new_resolver("agrpo_run_dir", run_dir)
    register_run_dir_resolver()  # hydra.run.dir's unique suffix (two runs started in the same second)


# `${agrpo_run_suffix:}` (hydra.run.dir in conf/config.yaml) is `<pid>-<4 random hex digits>`, made once per process:
# two runs started in the same second differ by pid on one machine, and by the random part across machines sharing a
# filesystem. Made once because Hydra may resolve hydra.run.dir more than once.
RESOLVER = "agrpo_run_suffix"
_SUFFIX: list[str] = []


def run_suffix() -> str:
    if not _SUFFIX:
        _SUFFIX.append(f"{os.getpid()}-{secrets.token_hex(2)}")
    return _SUFFIX[0]


def register_run_dir_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, run_suffix)
