"""launcher=hf_jobs: the run as Hugging Face Jobs, replicas and trainer on separate machines, sharing a bucket.

On the launching machine (role=all): create the bucket if missing; launch R replica Jobs; wait until each
serves /health through its exposed URL (a replica that fails or never gets healthy cancels everything, naming it
and why); launch the trainer Job; stream its logs; when it ends, or on Ctrl-C, cancel every Job of the run.
Inside the trainer Job (role=trainer): see hf_jobs_trainer.py.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from typing import Any

from agrpo.errors import LaunchError
from agrpo.launchers.base import Launcher, register
from agrpo.launchers.hf_jobs_client import (TERMINAL_STAGES, cancel_jobs, hf_token, log_tail, make_api,
                                            resolve_namespace, secret_values, stage_of)
from agrpo.launchers.hf_jobs_plan import TOKEN_SECRET, JobsPlan, build_jobs_plan, replica_url, trainer_job
from agrpo.launchers.hf_jobs_ready import ReplicaJob, ReplicaNotReady, probe_health, wait_until_ready

log = logging.getLogger(__name__)


def task_overrides() -> list[str]:
    """The overrides the user typed (what the trainer Job repeats), from Hydra; none outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _sigterm_as_interrupt(_signum, _frame):
    raise KeyboardInterrupt


class JobsRun:
    """One launch of a plan: the Jobs it created, so that whatever happens they are cancelled."""

    def __init__(self, cfg: Any, api: Any, namespace: str, overrides: list[str], echo=print):
        self.cfg, self.api, self.namespace, self.overrides, self.echo = cfg, api, namespace, overrides, echo
        self.jobs = cfg.launcher.hf_jobs
        self.launched: list[str] = []

    def _run(self, spec: Any, secrets: dict[str, str]) -> Any:
        info = self.api.run_job(**spec.run_job_kwargs(self.namespace, secrets))
        self.launched.append(info.id)
        log.info("launched %s Job %s (%s, %s): %s", spec.role, info.id, spec.flavor, spec.name, info.url)
        return info

    def _stage(self, job_id: str) -> tuple[str, str | None]:
        job = self.api.inspect_job(job_id=job_id, namespace=self.namespace)
        return stage_of(job), job.status.message

    def launch_replicas(self, plan: JobsPlan, secrets: dict[str, str]) -> list[ReplicaJob]:
        replicas = []
        for spec in plan.replicas:
            info = self._run(spec, secrets)
            replicas.append(ReplicaJob(spec.name, info.id, replica_url(self.cfg, info.id)))
        return replicas

    def wait_ready(self, replicas: list[ReplicaJob], token: str | None) -> float:
        try:
            return wait_until_ready(
                replicas, self._stage, lambda url: probe_health(url, token), self.jobs.ready_timeout_s,
                self.jobs.poll_interval_s,
                on_ready=lambda r, s: log.info("replica %s healthy after %.0f s: %s", r.name, s, r.url))
        except ReplicaNotReady as error:
            tail = log_tail(self.api, self.namespace, error.replica.job_id)
            logs = ("; its last log lines:\n" + "\n".join(tail)) if tail else ""
            raise LaunchError(f"{error}. Every Job of run {self.jobs.run_id} was cancelled{logs}") from None

    def watch_trainer(self, job_id: str) -> Any:
        """Stream the trainer's logs until it is over (waiting out a platform requeue); return its last JobInfo."""
        printed = 0  # a new stream replays the Job's logs from the start: print each line once
        while True:
            for index, line in enumerate(self.api.fetch_job_logs(job_id=job_id, namespace=self.namespace,
                                                                 follow=True)):
                if index >= printed:
                    self.echo(line)
                    printed += 1
            info = self._wait_terminal(job_id)
            if stage_of(info) != "ERROR" or self.jobs.trainer_attempts <= 1:
                return info
            deadline = time.monotonic() + self.jobs.requeue_grace_s
            while stage_of(info) in TERMINAL_STAGES and time.monotonic() < deadline:
                time.sleep(self.jobs.poll_interval_s)
                info = self.api.inspect_job(job_id=job_id, namespace=self.namespace)
            if stage_of(info) in TERMINAL_STAGES:
                return info
            log.warning("trainer Job %s was requeued by the platform: following the next attempt", job_id)

    def _wait_terminal(self, job_id: str) -> Any:
        while True:
            info = self.api.inspect_job(job_id=job_id, namespace=self.namespace)
            if stage_of(info) in TERMINAL_STAGES:
                return info
            time.sleep(self.jobs.poll_interval_s)

    def execute(self) -> dict[str, Any]:
        cfg, jobs = self.cfg, self.jobs
        plan = build_jobs_plan(cfg, self.overrides, self.namespace)
        secrets = secret_values([*plan.replicas[0].secrets, *plan.trainer.secrets])
        self.api.create_bucket(plan.bucket, private=True, exist_ok=True)
        detached = False
        try:
            replicas = self.launch_replicas(plan, secrets)
            took = self.wait_ready(replicas, secrets.get(TOKEN_SECRET) or hf_token())
            log.info("%d replica(s) healthy after %.0f s", len(replicas), took)
            spec = trainer_job(cfg, self.overrides, self.namespace, jobs.run_id, [r.url for r in replicas],
                               launch_id=uuid.uuid4().hex[:12])
            trainer = self._run(spec, secrets)
            summary = {"run_id": jobs.run_id, "namespace": self.namespace, "trainer_job": trainer.id,
                       "replica_jobs": [r.job_id for r in replicas], "run_dir": cfg.sync.output_dir}
            if jobs.detach:
                detached = True
                self.echo(f"agrpo: run {jobs.run_id} launched; the trainer Job {trainer.url} cancels the replicas "
                          f"when it ends. Follow it with `agrpo jobs logs {jobs.run_id}`, stop it with "
                          f"`agrpo jobs cancel {jobs.run_id}`")
                return summary
            final = self.watch_trainer(trainer.id)
            if stage_of(final) != "COMPLETED":
                why = f": {final.status.message}" if final.status.message else ""
                raise LaunchError(f"the trainer Job {trainer.id} ended with stage {stage_of(final)}{why}. Its "
                                  f"checkpoints stay in the bucket {plan.bucket} under {cfg.sync.output_dir}; relaunch "
                                  f"with launcher.hf_jobs.run_id={jobs.run_id} to resume")
            return summary
        except KeyboardInterrupt:
            raise LaunchError(f"interrupted; every Job of run {jobs.run_id} was cancelled") from None
        finally:
            if not detached:
                cancelled = cancel_jobs(self.api, self.namespace, self.launched)
                if cancelled:
                    log.info("cancelled %d Job(s) of run %s", len(cancelled), jobs.run_id)


@register
class HFJobsLauncher(Launcher):
    name = "hf_jobs"

    def __init__(self) -> None:
        self.inner: Launcher | None = None  # inside the trainer Job: the launcher of proxy + trainer

    def build_plan(self, cfg: Any) -> Any:
        if cfg.role == "trainer":  # inside the trainer Job: proxy + trainer against the replicas' URLs
            from agrpo.launchers.base import get_launcher

            self.inner = get_launcher(cfg.launcher.hf_jobs.trainer_launcher)
            return self.inner.build_plan(cfg)
        return build_jobs_plan(cfg, task_overrides(), cfg.launcher.hf_jobs.namespace)

    def execute(self, cfg: Any, plan: Any) -> dict[str, Any]:
        if cfg.role == "trainer":
            from agrpo.launchers.hf_jobs_trainer import run_trainer_job

            if self.inner is None:
                raise LaunchError("HFJobsLauncher.execute needs the plan built by its own build_plan")
            return run_trainer_job(cfg, plan, self.inner.execute)
        api = make_api()
        namespace = resolve_namespace(api, cfg.launcher.hf_jobs.namespace)
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        try:
            return JobsRun(cfg, api, namespace, task_overrides()).execute()
        finally:
            signal.signal(signal.SIGTERM, previous)
