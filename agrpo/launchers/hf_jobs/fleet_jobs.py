"""Inside the trainer Job, inference.replicas=auto: the fleet controller (agrpo/fleet/controller.py) with replica Jobs
for replicas.

The trainer Job's local launcher runs the controller beside the trainer, as on one machine; what differs is what a
replica is. Adding one launches a replica Job from the fleet record the launcher uploaded (fleet.py: the template the
dry run printed, named `<run_id>-vllm-<n>`, with this run's labels, so `agrpo jobs`, the trainer Job's last cancel and
the launcher's end report all find it); once its exposed URL answers /health (with the HF token, as the Jobs proxy
wants) the proxy admits it after replaying the adapters. Releasing one drains it through the proxy, then cancels its
Job. A serving replica Job that ends on its own (preempted, failed) is lost: it leaves the proxy, and while the fleet
is below min_replicas another is launched in its place (at most inference.fleet.max_replacements per run).

Stages come from one `list_jobs` call per `refresh_s` (launcher.hf_jobs.poll_interval_s) for the whole launch, not one
call per replica per poll.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.fleet.controller import FleetController, http
from agrpo.hub_compat import supported_kwargs
from agrpo.launchers.fleet_run import controller_settings, fleet_setting, policy_knobs
from agrpo.launchers.hf_jobs.client import TERMINAL_STAGES, cancel_jobs, hf_token, run_jobs, secret_values, stage_of
from agrpo.launchers.hf_jobs.cost import read_prices
from agrpo.launchers.hf_jobs.fleet import FLEET_FILE, JobsFleet
from agrpo.launchers.hf_jobs.plan import LAUNCH_ID_ENV, JobSpec
from agrpo.launchers.hf_jobs.ready import probe_health
from agrpo.launchers.plan import FleetPlan
from agrpo.proxy.settings import ADMIN_TOKEN_ENV

log = logging.getLogger(__name__)


class JobsPool:
    """This launch's replica Jobs: launched from the fleet record's template, their stages, their cancelling."""

    def __init__(
        self,
        api: Any,
        fleet: JobsFleet,
        namespace: str,
        run_id: str,
        launch_id: str,
        url_pattern: str,
        port: int,
        refresh_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api, self.fleet, self.namespace = api, fleet, namespace
        self.run_id, self.launch_id = run_id, launch_id
        self.url_pattern, self.port = url_pattern, port
        self.refresh_s, self.clock = refresh_s, clock
        self.stages: dict[str, tuple[str, str | None]] = {}  # job id -> (stage, message) as last listed
        self.listed_at = -math.inf
        self.next_index = fleet.min_replicas
        self.secrets: dict[str, str] | None = None  # read from this Job's env at the first launch

    def url(self, job_id: str) -> str:
        return self.url_pattern.format(job_id=job_id, port=self.port)

    def refresh(self, force: bool = False) -> list[Any]:
        """List the launch's replica Jobs (at most once per refresh_s unless forced)."""
        if not force and self.clock() - self.listed_at < self.refresh_s:
            return []
        self.listed_at = self.clock()
        jobs = run_jobs(self.api, self.namespace, self.run_id, role="replica", launch_id=self.launch_id)
        for job in jobs:
            self.stages[job.id] = (stage_of(job), job.status.message)
        self.next_index = max(self.next_index, len(jobs))  # names go on after every Job of this launch
        return jobs

    def stage(self, job_id: str) -> tuple[str, str | None]:
        try:
            self.refresh()
        except Exception as error:  # the Hub did not answer this time: the stages as last listed
            log.debug("listing the replica Jobs: %s", error)
        return self.stages.get(job_id, ("SCHEDULING", None))  # launched since the last listing

    def serving(self) -> list[JobReplica]:
        """The replica Jobs of this launch that run now (the launcher's, or a previous attempt's), as replicas."""
        running = [job for job in self.refresh(force=True) if stage_of(job) == "RUNNING"]
        return [JobReplica(self, (job.labels or {}).get("name", job.id), job_id=job.id) for job in running]

    def new(self) -> JobReplica:
        spec = self.fleet.spec(self.next_index)
        self.next_index += 1
        return JobReplica(self, spec.name, spec=spec)

    def run(self, spec: JobSpec) -> str:
        if self.secrets is None:
            self.secrets = secret_values(spec.secrets)  # this Job's own secrets: the trainer Job has them all
        kwargs = supported_kwargs(self.api.run_job, spec.run_job_kwargs(self.namespace, self.secrets))
        info = self.api.run_job(**kwargs)
        self.stages[info.id] = (stage_of(info), None)
        log.info("launched replica Job %s (%s, %s)", info.id, spec.flavor, spec.name)
        return info.id

    def cancel(self, job_id: str) -> None:
        cancel_jobs(self.api, self.namespace, [job_id])
        self.stages[job_id] = ("CANCELED", "released by the fleet")


@dataclass
class JobReplica:
    """One replica Job as the fleet controller handles a replica: start, alive, stop, name, health_url, log_path."""

    pool: JobsPool
    name: str
    spec: JobSpec | None = None  # None: a Job that exists already (job_id)
    job_id: str | None = None
    error: str = ""  # why the launch was refused

    @property
    def health_url(self) -> str | None:
        return f"{self.pool.url(self.job_id)}/health" if self.job_id else None

    @property
    def log_path(self) -> str:
        if self.error:
            return f"the Jobs API refused it: {self.error}"
        return f"`agrpo jobs logs {self.pool.run_id}`, Job {self.job_id}"

    def start(self) -> None:
        """Launch the Job; a refusal is kept (`error`) and the replica reads as not alive: the controller then says
        it did not start and backs off, as for a local replica that exits at once."""
        try:
            self.job_id = self.pool.run(self.spec)
        except Exception as error:  # the Jobs API's 400 (its own message), run_job's ValueError, the network
            from agrpo.launchers.hf_jobs.executor import reason

            self.error = f"{type(error).__name__}: {reason(error)}"

    def alive(self) -> bool:
        return self.job_id is not None and self.pool.stage(self.job_id)[0] not in TERMINAL_STAGES

    def stop(self) -> None:
        if self.job_id is not None:
            self.pool.cancel(self.job_id)

    def ended(self) -> str:
        stage, message = self.pool.stage(self.job_id) if self.job_id else ("not launched", self.error)
        return f"Job {self.job_id} {stage}" + (f": {message}" if message else "")


@dataclass
class JobsFleetPlan(FleetPlan):
    """The in-Job local plan's fleet: replica Jobs from the fleet record instead of local spare processes."""

    record: JobsFleet | None = None
    namespace: str = ""
    run_id: str = ""
    launch_id: str = ""
    url_pattern: str = ""
    port: int = 8000
    refresh_s: float = 10.0
    startup_timeout_s: float = 1800.0  # launcher.hf_jobs.ready_timeout_s: scheduling, image pull and model load
    api: Any = field(default=None, repr=False)  # the Hub client (None: make_api() when the controller is built)

    def build_controller(self, plan: Any, replicas: list[Any], started: list[Any]) -> FleetController:
        """The controller the local launcher runs (agrpo/launchers/fleet_run.py dispatches here). `replicas` and
        `started` are the local executor's lists, which hold processes: replica Jobs never join them (the trainer
        Job's last step cancels every replica Job of the run; a lost one is replaced, not restarted)."""
        from agrpo.launchers.hf_jobs.client import make_api

        api = self.api or make_api()
        pool = JobsPool(
            api, self.record, self.namespace, self.run_id, self.launch_id, self.url_pattern, self.port, self.refresh_s
        )
        proxy = next(spec for spec in plan.services if spec.role == "proxy")
        proxy_url = f"http://127.0.0.1:{proxy.port}"
        token = hf_token() or ""
        prices = read_prices(api)
        price = prices.of(self.record.replica.flavor)
        return FleetController(
            run_dir=plan.run_dir,
            proxy_url=proxy_url,
            admin_token=proxy.env[ADMIN_TOKEN_ENV],
            spares=[],
            supervised=[],
            started=[],
            knobs=policy_knobs(plan),
            **controller_settings(self.policy),
            startup_timeout_s=self.startup_timeout_s,
            inflight_ceiling=self.inflight_ceiling,
            say=lambda line: print(line, flush=True),
            get=lambda url: http("GET", url, token="" if url.startswith(proxy_url) else token, timeout_s=5.0),
            healthy=lambda url: probe_health(url.removesuffix("/health"), token)[0],
            new_spare=pool.new,
            watched=pool.serving(),
            replace_lost=True,
            max_replacements=fleet_setting(self.policy, "max_replacements"),
            price_per_hour=price or 0.0,
            price_source=f"{self.record.replica.flavor}, {prices.source}",
        )


def jobs_fleet_plan(cfg: RunConfig, api: Any = None) -> JobsFleetPlan:
    """The trainer Job's fleet from the record the launcher uploaded into the run's folder (read through the mount)."""
    path = Path(str(cfg.sync.output_dir)) / FLEET_FILE
    record = JobsFleet.from_json(path.read_text(), source=str(path))
    jobs = cfg.launcher.hf_jobs
    return JobsFleetPlan(
        min_replicas=record.min_replicas,
        max_replicas=record.max_replicas,
        policy=dict(record.policy),
        inflight_ceiling=record.inflight_ceiling,
        record=record,
        namespace=str(jobs.namespace),
        run_id=str(jobs.run_id),
        launch_id=os.environ.get(LAUNCH_ID_ENV, ""),
        url_pattern=str(jobs.replica_url),
        port=int(jobs.replica_port),
        refresh_s=float(jobs.poll_interval_s),
        startup_timeout_s=float(jobs.ready_timeout_s),
        api=api,
    )
