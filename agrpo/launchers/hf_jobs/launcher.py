"""launcher=hf_jobs: the run as Hugging Face Jobs, replicas and trainer on separate machines, sharing a bucket.

build_plan: the whole launch as data (planner.py); execute: that plan and nothing else (executor.py), on the Hub
backend the launcher was given (hub.py: the real Hub unless agrpo's command line picked another). Inside the
trainer Job, `python -m agrpo.launchers.hf_jobs.trainer CONFIG` runs proxy + trainer (trainer.py).
"""

from __future__ import annotations

import signal
from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.errors import ConfigError
from agrpo.launchers.base import Launcher, register
from agrpo.launchers.hf_jobs.cost import PRICE_PER_HOUR_USD
from agrpo.launchers.hf_jobs.hub import HubBackend, RealHub
from agrpo.launchers.hf_jobs.plan import NAMESPACE_PLACEHOLDER, JobsPlan, bind_namespace, bind_placeholder


def _sigterm_as_interrupt(_signum, _frame):
    raise KeyboardInterrupt


@register
class HFJobsLauncher(Launcher):
    name = "hf_jobs"

    def __init__(self, hub: HubBackend | None = None) -> None:
        """`hub`: the backend the plan runs on (agrpo/launchers/hf_jobs/hub.py); None: the real Hub."""
        self.hub: HubBackend = hub or RealHub()

    def build_plan(self, cfg: RunConfig) -> JobsPlan:
        from agrpo.launchers.hf_jobs.planner import build_jobs_plan

        if cfg.role == "trainer":
            raise ConfigError(
                "role=trainer with launcher=hf_jobs is the trainer Job's own config: it runs with "
                "`python -m agrpo.launchers.hf_jobs.trainer <run dir>/config.yaml`, not `python -m "
                "agrpo`; launch the run with role=all"
            )
        return build_jobs_plan(cfg, hub=self.hub)

    def execute(self, plan: JobsPlan) -> dict[str, Any]:
        """Run `plan` (it holds everything) on this launcher's backend: the executor is handed what the backend
        yields (its API, token, how it reaches an exposed URL), and the plan gets the values only it knows."""
        from agrpo.launchers.hf_jobs.executor import JobsRun
        from agrpo.launchers.hf_jobs.terminal import launch_console

        named = None if plan.namespace == NAMESPACE_PLACEHOLDER else plan.namespace
        with launch_console(plan.after.launch_log if plan.after else None, self.hub.detail_loggers):
            previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            try:
                with self.hub.connect(named, PRICE_PER_HOUR_USD) as hub:
                    bound = bind_namespace(plan, hub.namespace)
                    for placeholder, value in hub.placeholders.items():
                        bound = bind_placeholder(bound, placeholder, value)
                    run = JobsRun(bound, hub.api, reach=hub.reach, token=hub.token, replay=hub.replay)
                    return {**run.execute(), **hub.outcome}
            finally:
                signal.signal(signal.SIGTERM, previous)
