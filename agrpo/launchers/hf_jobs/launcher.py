"""launcher=hf_jobs: the run as Hugging Face Jobs, replicas and trainer on separate machines, sharing a bucket.

build_plan: the whole launch as data (planner.py); execute: that plan and nothing else (executor.py). Inside the
trainer Job, `python -m agrpo.launchers.hf_jobs.trainer CONFIG` runs proxy + trainer (trainer.py).
"""

from __future__ import annotations

import signal
from typing import Any

from agrpo.errors import ConfigError
from agrpo.launchers.base import Launcher, register
from agrpo.launchers.hf_jobs.plan import NAMESPACE_PLACEHOLDER, JobsPlan, bind_namespace, bind_placeholder


def _sigterm_as_interrupt(_signum, _frame):
    raise KeyboardInterrupt


@register
class HFJobsLauncher(Launcher):
    name = "hf_jobs"

    def build_plan(self, cfg: Any) -> JobsPlan:
        from agrpo.launchers.hf_jobs.planner import build_jobs_plan

        if cfg.role == "trainer":
            raise ConfigError(
                "role=trainer with launcher=hf_jobs is the trainer Job's own config: it runs with "
                "`python -m agrpo.launchers.hf_jobs.trainer <run dir>/config.yaml`, not `python -m "
                "agrpo`; launch the run with role=all"
            )
        return build_jobs_plan(cfg)

    def execute(self, plan: JobsPlan) -> dict[str, Any]:
        """Run `plan` (it holds everything); with plan.rehearse, against the local stand-in."""
        from agrpo.launchers.hf_jobs.terminal import launch_console

        with launch_console(plan.after.launch_log if plan.after else None):
            if plan.rehearse:
                return execute_rehearsal(plan)
            return execute_on_hub(plan)


def execute_on_hub(plan: JobsPlan) -> dict[str, Any]:
    from agrpo.launchers.hf_jobs.client import make_api, resolve_namespace
    from agrpo.launchers.hf_jobs.executor import JobsRun

    api = make_api()
    if plan.namespace == NAMESPACE_PLACEHOLDER:
        plan = bind_namespace(plan, resolve_namespace(api, None))
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return JobsRun(plan, api).execute()
    finally:
        signal.signal(signal.SIGTERM, previous)


def execute_rehearsal(plan: JobsPlan) -> dict[str, Any]:
    """The same plan against a stand-in started here and stopped (every Job ended) before this returns: the executor
    is handed the stand-in's API, token and gateway in place of the Hub's."""
    from agrpo.launchers.hf_jobs.executor import JobsRun
    from agrpo.launchers.hf_jobs.plan import PRICE_PER_HOUR_USD
    from agrpo.rehearsal.rehearse import GATEWAY_PLACEHOLDER, REHEARSAL_NAMESPACE, rehearsal

    spec = plan.rehearse
    namespace = REHEARSAL_NAMESPACE if plan.namespace == NAMESPACE_PLACEHOLDER else plan.namespace
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        with rehearsal(
            namespace, spec.listing_lag_s, spec.negative_cache_s, spec.root, prices=PRICE_PER_HOUR_USD
        ) as stand_in:
            bound = bind_placeholder(bind_namespace(plan, namespace), GATEWAY_PLACEHOLDER, stand_in.gateway_port)
            root = str(stand_in.stand_in.root)
            run = JobsRun(
                bound, stand_in.api(), reach=stand_in.reach, token=stand_in.token, replay=["--rehearsal-dir", root]
            )
            try:
                return {**run.execute(), "rehearsal_dir": root}
            finally:
                print(f"agrpo: the rehearsal's Jobs (jobs.json, jobs/<id>/log.txt) and bucket stay in {root}")
    finally:
        signal.signal(signal.SIGTERM, previous)
