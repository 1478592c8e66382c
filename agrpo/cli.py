"""`python -m agrpo +recipe=NAME [overrides]` (or the `agrpo` console script): compose, validate, plan, run.

A user-facing error (bad config, missing model, a server that does not start) is printed as one paragraph and the
process exits non-zero; no traceback unless AGRPO_DEBUG=1.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from agrpo import __version__
from agrpo.config.schema import register_configs
from agrpo.config.resolve import resolve
from agrpo.config.validate import validate
from agrpo.errors import AgrpoError, ConfigError
from agrpo.launchers.run_dir import discard_if_empty, record_recipe_files
from agrpo.paths import CONF_DIR, RECIPES_DIR, register_resolvers

log = logging.getLogger("agrpo")


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, build the launcher's plan, print it (dry run) or execute it. Returns the final metrics."""
    from agrpo.launchers import get_launcher

    validate(cfg)
    cfg = resolve(cfg, cuda_available=runs_on_gpus(cfg))  # every derived value fixed once: config.yaml shows it
    launcher = get_launcher(cfg.launcher.name)
    plan = launcher.build_plan(cfg)
    if cfg.launcher.dry_run:
        print(plan.render())
        return {}
    log.info("plan:\n%s", plan.render())
    return launcher.execute(cfg, plan)


def runs_on_gpus(cfg: DictConfig) -> bool:
    """Whether the run's replicas and trainer have CUDA: HF Jobs always do; locally, this machine decides."""
    if cfg.launcher.name == "hf_jobs" and cfg.role == "all" and not cfg.rehearsal.enabled:
        return True  # a rehearsal runs the Jobs on this machine
    import torch

    return torch.cuda.is_available()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    run_dir = HydraConfig.get().runtime.output_dir
    record_recipe_files(run_dir, TYPED_RECIPES)  # so that printed commands name the recipe file as it was typed
    try:
        summary = run(cfg)
        if cfg.launcher.dry_run and not in_multirun():
            discard_if_empty(run_dir)  # a dry run leaves no run folder behind
    except AgrpoError as error:
        if not in_multirun():
            discard_if_empty(run_dir)  # nor does a run refused before it started anything
        if os.environ.get("AGRPO_DEBUG") == "1":
            raise
        print(f"agrpo: error: {error}", file=sys.stderr)
        if in_multirun() and not isinstance(error.__context__, KeyboardInterrupt):
            # Keep the sweep going: the point shows as failed in the summary (and to Optuna, which cannot score
            # None); `agrpo` exits non-zero at the end. sys.exit here would end the whole sweep. Ctrl-C still does.
            from agrpo.sweeps import record_point_error

            record_point_error(HydraConfig.get().runtime.output_dir, str(error))
            return None
        sys.exit(error.exit_code)
    if summary.get("reward_last") is not None:  # the trainer's summary said it all on the console
        return float(summary["reward_last"])  # what Hydra sweepers (e.g. Optuna) optimise
    return None


def in_multirun() -> bool:
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def expand_recipe_paths(argv: list[str]) -> list[str]:
    """Let `+recipe=` take a path to the user's own YAML: it becomes a `recipe` group option held in memory.

    `+recipe=NAME` is a file under agrpo/conf/recipe (recipes/ in the checkout). A path is read and stored in Hydra's
    ConfigStore as `recipe/<stem>` (nothing is written anywhere), in package `_global_` unless its own
    `# @package` header says otherwise: the header is optional. Raises ConfigError when the file is not there.
    """
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("+recipe", "recipe") and (value.endswith((".yaml", ".yml")) or os.sep in value):
            arg = f"{key}={store_recipe_file(value)}"
        out.append(arg)
    return out


def store_recipe_file(value: str) -> str:
    """Store the recipe file at `value` as a `recipe` group option and return the option's name."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.config_source import ConfigSource
    from omegaconf import OmegaConf

    source = Path(value).expanduser().resolve()
    if not source.is_file():
        raise ConfigError(f"recipe file {value!r} does not exist (+recipe= takes a recipe name or a YAML path)")
    text = source.read_text()
    try:
        package = ConfigSource._get_header_dict(text)["package"] or "_global_"
        node = OmegaConf.create(text)
    except Exception as error:  # a YAML or header syntax error: the message says where
        raise ConfigError(f"recipe file {value!r} cannot be read: {error}") from None
    # A shipped recipe of the same name would shadow the file (it comes first in Hydra's search path).
    name = source.stem if not (RECIPES_DIR / f"{source.stem}.yaml").exists() else f"{source.stem}_file"
    ConfigStore.instance().store(group="recipe", name=name, node=node, package=package, provider=str(source))
    TYPED_RECIPES[name] = value
    return name


TYPED_RECIPES: dict[str, str] = {}  # recipe option name -> the recipe file as typed (recorded in each run dir)


# `agrpo <subcommand> ...`: tools beside the training entrypoint, each a module with `main(argv) -> int`.
SUBCOMMANDS = {
    "jobs": "agrpo.launchers.hf_jobs.cli",  # agrpo jobs status|logs|cancel RUN_ID
    "pull": "agrpo.launchers.hf_jobs.pull",  # agrpo pull RUN_ID: a Jobs run's folder into outputs/<run_name>/<RUN_ID>
    "eval": "agrpo.eval.cli",  # agrpo eval +recipe=NAME [eval.adapter=PATH]
    "plot": "agrpo.report.plot",  # agrpo plot RUN_DIR [RUN_DIR...] [-o out.png]
    "push": "agrpo.report.push",  # agrpo push RUN_DIR --repo-id NAME [--private]
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[sys.argv[1]]).main(sys.argv[2:]))
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):  # Hydra's own: --hydra-help
        from agrpo.help import help_text

        print(help_text(Path(CONF_DIR)))
        return
    if len(sys.argv) > 1 and sys.argv[1] in ("--version", "-V"):  # Hydra's own --version prints Hydra's
        print(f"agrpo {__version__}")
        return
    register_configs()
    register_resolvers()
    from agrpo.rehearsal.spelling import respell

    overrides, notes = respell(sys.argv[1:])  # launcher.hf_jobs.rehearse=true: the rehearsal's old spelling
    for note in notes:
        print(f"agrpo: {note}", file=sys.stderr)
    try:
        sys.argv = [sys.argv[0], *expand_recipe_paths(overrides)]
    except ConfigError as error:
        print(f"agrpo: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    hydra_main()
    from agrpo.sweeps import LAST_SWEEP_FAILURES

    if LAST_SWEEP_FAILURES:
        print(
            f"agrpo: error: sweep point(s) {', '.join(LAST_SWEEP_FAILURES)} failed (see the table above)",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
