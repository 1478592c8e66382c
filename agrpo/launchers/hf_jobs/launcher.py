"""launcher=hf_jobs: the run as Hugging Face Jobs, replicas and trainer on separate machines, sharing a bucket.

build_plan: the whole launch as data (planner.py); execute: that plan and nothing else (executor.py). Inside the
trainer Job, `python -m agrpo.launchers.hf_jobs.trainer CONFIG` runs proxy + trainer (trainer.py).
"""

from __future__ import annotations

import signal
from typing import Any

from agrpo.errors import ConfigError
from agrpo.launchers.base import Launcher, register
from agrpo.launchers.hf_jobs.plan import NAMESPACE_PLACEHOLDER, JobsPlan, bind_namespace


def _sigterm_as_interrupt(_signum, _frame):
    raise KeyboardInterrupt


@register
class HFJobsLauncher(Launcher):
    name = "hf_jobs"

    def build_plan(self, cfg: Any) -> JobsPlan:
        from agrpo.launchers.hf_jobs.planner import build_jobs_plan

        if cfg.role == "trainer":
            raise ConfigError("role=trainer with launcher=hf_jobs is the trainer Job's own config: it runs with "
                              "`python -m agrpo.launchers.hf_jobs.trainer <run dir>/config.yaml`, not `python -m "
                              "agrpo`; launch the run with role=all")
        return build_jobs_plan(cfg)

    def execute(self, cfg: Any, plan: JobsPlan) -> dict[str, Any]:
        """Run `plan` (cfg is not read: the plan holds everything)."""
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
