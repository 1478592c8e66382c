"""`python -m agrpo +recipe=NAME [overrides]` (or the `agrpo` console script): compose, validate, plan, run.

Hydra owns the command line, but for agrpo's flags that choose where a launcher=hf_jobs plan runs (its Hub backend,
agrpo/launchers/hf_jobs/hub.py): they are taken out before Hydra parses the rest, and are not config keys.

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
from agrpo.config.prepare import prepare
from agrpo.config.recipe_files import TYPED_RECIPES, expand_recipe_paths, record_recipe_files
from agrpo.config.recipe_files import store_recipe_file  # noqa: F401 (tests and tools import it from here)
from agrpo.config.schema import register_configs
from agrpo.errors import AgrpoError, ConfigError
from agrpo.launchers.run_dir import discard_if_empty
from agrpo.paths import CONF_DIR, register_resolvers

log = logging.getLogger("agrpo")


def run(cfg: DictConfig, hub: Any = None) -> dict[str, Any]:
    """Prepare (validate, resolve), build the launcher's plan, print it (dry run) or execute it. Returns the final
    metrics. `hub`: the Hub backend a launcher=hf_jobs plan runs on (None: the real Hub)."""
    from agrpo.launchers import get_launcher

    if hub is None:
        options, here = {}, False
    elif cfg.launcher.name != "hf_jobs":
        raise ConfigError(
            f"{hub.asked_by} chooses where a launcher=hf_jobs plan runs, and this run has launcher="
            f"{cfg.launcher.name}: add launcher=hf_jobs sync=bucket, or leave {hub.asked_by} out"
        )
    else:
        options, here = {"hub": hub}, hub.jobs_on_this_machine
    cfg = prepare(cfg, jobs_on_this_machine=here)  # every derived value fixed once: config.yaml shows it
    launcher = get_launcher(cfg.launcher.name, **options)
    plan = launcher.build_plan(cfg)
    if cfg.launcher.dry_run:
        print(plan.render())
        return {}
    log.info("plan:\n%s", plan.render())
    return launcher.execute(plan)


def hydra_main(hub: Any = None) -> Any:
    """Hydra's entrypoint for a run on `hub` (Hydra calls it with the composed config only)."""

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def main(cfg: DictConfig) -> float | None:
        return run_point(cfg, hub)

    return main


def run_point(cfg: DictConfig, hub: Any) -> float | None:
    """One run (a sweep's point): its errors as one paragraph, its reward for a sweeper."""
    run_dir = HydraConfig.get().runtime.output_dir
    record_recipe_files(run_dir, TYPED_RECIPES)  # so that printed commands name the recipe file as it was typed
    try:
        summary = run(cfg, hub)
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


# `agrpo <subcommand> ...`: tools beside the training entrypoint, each a module with `main(argv) -> int`.
SUBCOMMANDS = {
    "jobs": "agrpo.launchers.hf_jobs.cli",  # agrpo jobs status|logs|cancel RUN_ID
    "pull": "agrpo.launchers.hf_jobs.pull",  # agrpo pull RUN_ID: a Jobs run's folder into outputs/<run_name>/<RUN_ID>
    "eval": "agrpo.eval.cli",  # agrpo eval +recipe=NAME [eval.adapter=PATH]
    "plot": "agrpo.plot",  # agrpo plot RUN_DIR [RUN_DIR...] [-o out.png]
    "push": "agrpo.report.push",  # agrpo push RUN_DIR --repo-id NAME [--private]
    "fleet": "agrpo.launchers.fleet_cli",  # agrpo fleet up|down|status: a fleet several runs share
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[sys.argv[1]]).main(sys.argv[2:]))
    if any(arg in ("--help", "-h") for arg in sys.argv[1:]):  # Hydra's own: --hydra-help
        from agrpo.help import main_help

        sys.exit(main_help(Path(CONF_DIR), sys.argv[1:]))  # --help GROUP: its keys (agrpo/help.py)
    if len(sys.argv) > 1 and sys.argv[1] in ("--version", "-V"):  # Hydra's own --version prints Hydra's
        print(f"agrpo {__version__}")
        return
    register_configs()
    register_resolvers()
    from agrpo.launchers.hf_jobs.hub import backend_from_argv
    from agrpo.sweep_fleet import concurrent_argv

    try:
        hub, overrides, notes = backend_from_argv(sys.argv[1:])  # agrpo's own flags, before Hydra parses the rest
        for note in notes:
            print(f"agrpo: {note}", file=sys.stderr)
        sys.argv = [sys.argv[0], *expand_recipe_paths(overrides)]
        sys.argv = concurrent_argv(sys.argv)  # a multirun on a shared fleet: its points at once (agrpo/sweep_fleet.py)
    except ConfigError as error:
        print(f"agrpo: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    hydra_main(hub)()
    from agrpo.sweeps import LAST_SWEEP_FAILURES

    if LAST_SWEEP_FAILURES:
        print(
            f"agrpo: error: sweep point(s) {', '.join(LAST_SWEEP_FAILURES)} failed (see the table above)",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
