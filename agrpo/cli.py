"""`python -m agrpo +recipe=NAME [overrides]` (or the `agrpo` console script): compose, validate, plan, run.

A user-facing error (bad config, missing model, a server that does not start) is printed as one paragraph and the
process exits non-zero; no traceback unless AGRPO_DEBUG=1.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from agrpo.config.schema import register_configs
from agrpo.config.validate import validate
from agrpo.errors import AgrpoError
from agrpo.paths import CONF_DIR, register_resolvers

log = logging.getLogger("agrpo")


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, build the launcher's plan, print it (dry run) or execute it. Returns the final metrics."""
    from agrpo.launchers import get_launcher

    validate(cfg)
    launcher = get_launcher(cfg.launcher.name)
    plan = launcher.build_plan(cfg)
    if cfg.launcher.dry_run:
        print(plan.render())
        return {}
    log.info("plan:\n%s", plan.render())
    return launcher.execute(cfg, plan)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig) -> float | None:
    try:
        summary = run(cfg)
    except AgrpoError as error:
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
    if summary.get("reward_last") is not None:
        print(f"agrpo: mean reward first 5 steps {summary['reward_first']:.4f}, last 5 steps {summary['reward_last']:.4f}")
        return float(summary["reward_last"])  # what Hydra sweepers (e.g. Optuna) optimise
    return None


def in_multirun() -> bool:
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def expand_recipe_paths(argv: list[str]) -> list[str]:
    """Let `+recipe=` take a path to the user's own YAML: expose it as a `recipe` group option in a temp search path.

    `+recipe=NAME` resolves to recipes/NAME.yaml through the search path (conf/recipe links to recipes/).
    """
    out, extra_dirs, first_override = [], [], None
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("+recipe", "recipe") and (value.endswith((".yaml", ".yml")) or os.sep in value):
            source = Path(value).expanduser().resolve()
            if not source.is_file():
                print(f"agrpo: error: recipe file {value!r} does not exist", file=sys.stderr)
                sys.exit(2)
            root = Path(tempfile.mkdtemp(prefix="agrpo-recipe-"))
            (root / "recipe").mkdir()
            (root / "recipe" / f"{source.stem}.yaml").symlink_to(source)
            extra_dirs.append(f"file://{root}")
            arg = f"{key}={source.stem}"
            first_override = len(out) if first_override is None else first_override
        out.append(arg)
    if extra_dirs:  # placed among the overrides: argparse wants them before flags such as --cfg
        out.insert(first_override, f"hydra.searchpath=[{','.join(extra_dirs)}]")
    return out


# `agrpo <subcommand> ...`: tools beside the training entrypoint, each a module with `main(argv) -> int`.
SUBCOMMANDS = {
    "jobs": "agrpo.launchers.hf_jobs_cli",  # agrpo jobs status|logs|cancel RUN_ID
    "eval": "agrpo.eval.cli",  # agrpo eval +recipe=NAME [adapter=PATH]
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[sys.argv[1]]).main(sys.argv[2:]))
    register_configs()
    register_resolvers()
    sys.argv = [sys.argv[0], *expand_recipe_paths(sys.argv[1:])]
    hydra_main()
    from agrpo.sweeps import LAST_SWEEP_FAILURES

    if LAST_SWEEP_FAILURES:
        print(f"agrpo: error: sweep point(s) {', '.join(LAST_SWEEP_FAILURES)} failed (see the table above)",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
