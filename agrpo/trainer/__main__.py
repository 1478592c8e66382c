"""`python -m agrpo.trainer RESOLVED_CONFIG --vllm-url URL`: the trainer process a launcher starts.

It reads the resolved config that the entrypoint wrote to the run directory, so every process of a run (local
child, accelerate rank, HF Job) trains from the same values.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from agrpo.config.schema import RunConfig
from agrpo.config.spec import load_spec
from agrpo.errors import AgrpoError
from agrpo.trainer.trainer_error import report_trainer_error
from agrpo.cpus import apply_trainer_cpus

log = logging.getLogger("agrpo.trainer")  # agrpo's namespace: the console shows it (agrpo/trainer/console/callback.py)


class Terminated(BaseException):
    """SIGTERM reached the trainer (the launcher stopping the run). Raised in the main thread so that the trainer
    unwinds: TRL stops its rollout process and Python's exit releases the shared queues, events and values. Killed
    by the signal's default action instead, it left them to Python's resource tracker ("There appear to be 26 leaked
    semaphore objects to clean up at shutdown")."""


def _terminated(signum: int, _frame) -> None:
    signal.signal(signum, signal.SIG_IGN)  # once: the unwinding is not interrupted again
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agrpo.trainer", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="resolved config YAML written by `python -m agrpo`")
    parser.add_argument("--vllm-url", required=True, help="base URL of the vLLM server or of agrpo's proxy")
    parser.add_argument("--num-replicas", type=int, default=1, help="replicas behind the URL (scales in-flight work)")
    args = parser.parse_args(argv)
    cfg = load_spec(args.config)  # the run's typed spec, as prepare resolved it: nothing is derived again
    pinned = apply_trainer_cpus()  # before torch starts its threads; the rollout child inherits it
    from agrpo.trainer.console.logs import setup_trainer_logging

    setup_trainer_logging(cfg.sync.output_dir, cfg.logger.level)  # before TRL is imported (it sets env switches)
    if pinned:
        log.info("trainer pinned to CPU cores %s (the replicas have their own)", pinned)
    from agrpo.trainer.trl_backend import run_training

    signal.signal(signal.SIGTERM, _terminated)
    try:
        summary = run_training(cfg, args.vllm_url, args.num_replicas)
    except Terminated:
        log.debug("stopped by SIGTERM; what was written so far is kept in %s", cfg.sync.output_dir)
        return 128 + signal.SIGTERM
    except AgrpoError as error:
        report_trainer_error(str(error))  # the launcher shows it (agrpo/trainer/trainer_error.py)
        return error.exit_code
    except Exception as error:
        return report_disk_full(error, cfg)
    # The console's summary was the run's one ending ("agrpo: done, N steps, final adapter in PATH ...").
    log.debug("metrics: %s", {k: v for k, v in summary.items() if k != "rewards"})
    return 0


def report_disk_full(error: Exception, cfg: RunConfig) -> int:
    """A full disk is one paragraph (agrpo/trainer/disk_full.py), its traceback in trainer.log if it still fits;
    any other error is raised as it is."""
    from agrpo.trainer.disk_full import disk_figures, disk_full_cause, disk_full_message
    from agrpo.trainer.disk_full_quiet import settle_thread_hooks

    cause = disk_full_cause(error)
    if cause is None:
        raise error
    logging.raiseExceptions = False  # a log file on the full disk: no "--- Logging error ---" tracebacks
    log.debug("the disk is full", exc_info=error)
    report_trainer_error(disk_full_message(disk_figures(cfg.sync.output_dir, cfg.trainer.save_total_limit), cause))
    settle_thread_hooks()
    return 1


if __name__ == "__main__":
    sys.exit(main())
