"""Run a JobsPlan on the launching machine; the plan is the only input, so what runs is what the dry run printed.

Build the wheel the plan names (and the model, when it is built here); create the bucket if missing; upload the
wheel, this machine's model/data the Jobs read, and the resolved run config into the run's folder; launch the
replica Jobs; wait until each serves /health through its exposed URL (a replica that fails or never gets healthy
cancels everything, naming it and why); launch the trainer Job; stream its logs; when it ends, or on Ctrl-C, cancel
every Job this launch created.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from agrpo.errors import LaunchError
from agrpo.hub_compat import supported_kwargs
from agrpo.launchers.hf_jobs.client import (
    TERMINAL_STAGES,
    cancel_jobs,
    hf_token,
    log_tail,
    run_jobs,
    secret_values,
    stage_of,
)
from agrpo.launchers.hf_jobs.inputs import upload_pairs
from agrpo.launchers.hf_jobs.package import build_wheel, copy_source, wheel_build_dir
from agrpo.launchers.hf_jobs.plan import TOKEN_SECRET, JobSpec, JobsPlan, WheelBuild
from agrpo.launchers.hf_jobs.repack import installed_distribution, repack, site_dir, wheel_name
from agrpo.launchers.hf_jobs.outcome import end_report
from agrpo.launchers.hf_jobs.ready import ReplicaJob, ReplicaNotReady, probe_health, wait_until_ready
from agrpo.launchers.hf_jobs.terminal import JobLogView, banner_lines

log = logging.getLogger(__name__)


def make_wheel(spec: WheelBuild, out_dir: str) -> Path:
    """The wheel the plan names, in out_dir: built from a copy of the source tree, or packed from the install."""
    if spec.from_installed:
        dist = installed_distribution()
        if dist is None or site_dir(dist) != spec.package_root or wheel_name(dist) != spec.filename:
            raise LaunchError(
                f"the installed agrpo changed since the plan named {spec.filename} in {spec.package_root}; launch again"
            )
        return repack(dist, out_dir)
    copy_source(spec.package_root, f"{out_dir}/src")
    return build_wheel(spec.argv(out_dir), spec.filename, out_dir)


def refuse_secret_in_plan(plan: JobsPlan, secrets: dict[str, str]) -> None:
    """Last guard before anything leaves this machine: no secret value in any command, env, label or file."""
    text = json.dumps(dataclasses.asdict(plan))
    leaked = sorted(name for name, value in secrets.items() if value and value in text)
    if leaked:
        raise LaunchError(
            f"the value of the secret(s) {leaked} appears in the plan (a command, env value, label or "
            "the run config): remove it and name the secret in launcher.hf_jobs.secrets instead"
        )


def reason(error: Exception) -> str:
    """One line of why a Hub call failed: the Hub's own message when it sent one."""
    text = getattr(error, "server_message", None) or str(error)
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if getattr(error, "server_message", None) else (lines[0] if lines else "")


class JobsRun:
    """One launch of a plan: the Jobs it created, so that whatever happens they are cancelled."""

    def __init__(
        self,
        plan: JobsPlan,
        api: Any,
        echo=print,
        reach=lambda url: url,
        token: str | None = None,
        replay: list[str] | None = None,
    ):
        """`api`, `token` and `reach` are what this launch talks to: the Hub's (HfApi, the saved token, URLs as
        they are) or another Hub backend's (hub.py: a stand-in's API, its own token, its gateway); `replay` is what
        `agrpo pull` and `agrpo jobs` need to find it again afterwards (the backend's own flags). `echo` prints the
        trainer Job's console lines, `say` this launch's own (the banner, Job stages, the end of the run)."""
        self.plan, self.api, self.echo = plan, api, echo
        self.reach = reach  # how this process reaches an exposed URL (a stand-in: its gateway by path)
        self.token = token  # None: huggingface_hub's (HF_TOKEN or the saved login)
        self.replay = list(replay or [])
        self.watch = plan.watch
        self.launched: list[str] = []
        self.jobs: dict[str, JobSpec] = {}  # job id -> its spec, to name it in stage lines
        self.stages: dict[str, str] = {}  # job id -> the last stage said on the terminal

    def say(self, line: str) -> None:
        """A line of the launch itself: on the terminal and in the launch log."""
        print(line, flush=True)
        log.info(line)

    def _said_stage(self, job_id: str, stage: str, message: str | None = None) -> None:
        if self.stages.get(job_id) == stage:
            return
        self.stages[job_id] = stage
        spec = self.jobs.get(job_id)
        if spec is not None:
            self.say(f"{spec.role} {spec.name} (Job {job_id}): {stage}" + (f": {message}" if message else ""))

    def _run(self, spec: JobSpec, secrets: dict[str, str]) -> Any:
        kwargs = supported_kwargs(self.api.run_job, spec.run_job_kwargs(self.plan.namespace, secrets))  # hub 1.x/2.x
        try:
            info = self.api.run_job(**kwargs)
        except Exception as error:  # the Jobs API's 400 (flavor, labels, volume), run_job's own ValueError, network
            raise LaunchError(
                f"the Jobs API refused the {spec.role} Job {spec.name} ({type(error).__name__}: {reason(error)}); "
                f"every Job of run {self.plan.run_id} was cancelled"
            ) from None
        self.launched.append(info.id)
        self.jobs[info.id] = spec
        log.info("launched %s Job %s (%s, %s): %s", spec.role, info.id, spec.flavor, spec.name, info.url)
        self._said_stage(info.id, stage_of(info))
        return info

    def _stage(self, job_id: str) -> tuple[str, str | None]:
        job = self.api.inspect_job(job_id=job_id, namespace=self.plan.namespace)
        self._said_stage(job_id, stage_of(job), job.status.message)
        return stage_of(job), job.status.message

    def upload(self) -> None:
        """The wheel (built now, from the package root the plan names), this machine's model/data the Jobs read from
        the bucket (built first when the plan says so) and the run config, into the run's folder."""
        plan, files = self.plan, []
        out_dir = None
        try:
            for item in plan.inputs:
                pairs = upload_pairs(item)
                log.info("uploading %s (%d file(s)) for the Jobs to %s", item.source, len(pairs), item.job_path)
                files += pairs
            if plan.wheel:
                out_dir = wheel_build_dir()
                log.info("building %s from %s", plan.wheel.filename, plan.wheel.package_root)
                wheel = make_wheel(plan.wheel, out_dir)
                files.append((str(wheel), plan.wheel.path_in_bucket))
            files += plan.files()  # the run config (and, inference.replicas=auto, the fleet record)
            try:
                self.api.create_bucket(plan.bucket, private=True, exist_ok=True)
                self.api.batch_bucket_files(plan.bucket, add=files)
            except Exception as error:  # HTTP, network or Xet errors: one line, nothing was launched
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                raise LaunchError(
                    f"could not upload the run's files to the bucket {plan.bucket} "
                    f"({type(error).__name__}: {first}); no Job was created. Check the token's write "
                    "access to the bucket (sync.bucket)"
                ) from None
            log.info("uploaded %d file(s) to bucket %s under %s", len(files), plan.bucket, plan.run_dir)
        finally:
            if out_dir:
                shutil.rmtree(out_dir, ignore_errors=True)

    def launch_replicas(self, secrets: dict[str, str]) -> list[ReplicaJob]:
        replicas = []
        for spec in self.plan.replicas:
            info = self._run(spec, secrets)
            replicas.append(ReplicaJob(spec.name, info.id, self.plan.replica_url(info.id)))
        return replicas

    def wait_ready(self, replicas: list[ReplicaJob], token: str | None) -> float:
        try:
            return wait_until_ready(
                replicas,
                self._stage,
                lambda url: probe_health(self.reach(url), token),
                self.watch.ready_timeout_s,
                self.watch.poll_interval_s,
                on_ready=lambda r, s: self.say(f"replica {r.name} (Job {r.job_id}): healthy after {s:.0f} s"),
            )
        except ReplicaNotReady as error:
            tail = log_tail(self.api, self.plan.namespace, error.replica.job_id)
            logs = ("; its last log lines:\n" + "\n".join(tail)) if tail else ""
            raise LaunchError(f"{error}. Every Job of run {self.plan.run_id} was cancelled{logs}") from None

    def watch_trainer(self, job_id: str) -> Any:
        """Stream the trainer's logs until it is over (waiting out a platform requeue); return its last JobInfo."""
        namespace, watch = self.plan.namespace, self.watch
        printed = 0  # a new stream replays the Job's logs from the start: print each line once
        view = JobLogView()
        while True:
            for index, line in enumerate(self.api.fetch_job_logs(job_id=job_id, namespace=namespace, follow=True)):
                if index >= printed:
                    self._said_stage(job_id, "RUNNING")  # a Job that logs runs (its start fell between two polls)
                    if view.shows(line):
                        self.echo(line)
                    printed += 1
            info = self.api.inspect_job(job_id=job_id, namespace=namespace)
            self._said_stage(job_id, stage_of(info), info.status.message)
            if stage_of(info) not in TERMINAL_STAGES:
                # The stream ended before the Job did: a dropped stream, or a requeue that was already running again
                # when this looked (polling the stage alone would then wait silently, or for ever in the fake Hub).
                time.sleep(watch.poll_interval_s)
                continue
            if stage_of(info) != "ERROR" or watch.trainer_attempts <= 1:
                return info
            deadline = time.monotonic() + watch.requeue_grace_s
            while stage_of(info) in TERMINAL_STAGES and time.monotonic() < deadline:
                time.sleep(watch.poll_interval_s)
                info = self.api.inspect_job(job_id=job_id, namespace=namespace)
            if stage_of(info) in TERMINAL_STAGES:
                return info
            log.warning("trainer Job %s was requeued by the platform: following the next attempt", job_id)

    def execute(self) -> dict[str, Any]:
        plan = self.plan
        secrets = secret_values([name for job in plan.jobs() for name in job.secrets], token=self.token)
        refuse_secret_in_plan(plan, secrets)
        for line in banner_lines(plan):
            self.say(line)
        self.upload()
        detached, stage = False, "not started"
        try:
            replicas = self.launch_replicas(secrets)
            took = self.wait_ready(replicas, secrets.get(TOKEN_SECRET) or self.token or hf_token())
            log.info("%d replica(s) healthy after %.0f s", len(replicas), took)
            trainer = self._run(plan.trainer, secrets)
            summary = {
                "run_id": plan.run_id,
                "namespace": plan.namespace,
                "trainer_job": trainer.id,
                "replica_jobs": [r.job_id for r in replicas],
                "run_dir": plan.run_dir,
            }
            if self.watch.detach:
                detached = True
                self.echo(
                    f"agrpo: run {plan.run_id} launched; the trainer Job {trainer.url} cancels the replicas "
                    f"when it ends. Follow it with `agrpo jobs logs {plan.run_id}`, stop it with "
                    f"`agrpo jobs cancel {plan.run_id}`"
                )
                return summary
            final = self.watch_trainer(trainer.id)
            stage = stage_of(final)
            if stage != "COMPLETED":
                why = f": {final.status.message}" if final.status.message else ""
                raise LaunchError(
                    f"the trainer Job {trainer.id} ended with stage {stage_of(final)}{why}. Its "
                    f"checkpoints stay in the bucket {plan.bucket} under {plan.run_dir}; relaunch "
                    f"with launcher.hf_jobs.run_id={plan.run_id} to resume"
                )
            return summary
        except KeyboardInterrupt:
            stage = "interrupted"
            raise LaunchError(f"interrupted; every Job of run {plan.run_id} was cancelled") from None
        finally:
            if not detached:
                every = self.launch_jobs()
                cancelled = cancel_jobs(self.api, plan.namespace, every)
                if cancelled:
                    log.info("cancelled %d Job(s) of run %s", len(cancelled), plan.run_id)
                if every:  # what the Jobs cost (and, after a success, what to do next)
                    for line in end_report(plan, self.api, every, stage, self.replay):
                        self.say(line)

    def launch_jobs(self) -> list[str]:
        """Every Job of this launch: those created here, and (inference.replicas=auto) the replica Jobs the trainer
        Job launched, found by the launch label. Never raises: it runs on the way out."""
        if not self.launched or self.plan.fleet is None:
            return list(self.launched)
        try:
            listed = run_jobs(self.api, self.plan.namespace, self.plan.run_id, launch_id=self.plan.launch_id)
        except Exception as error:  # the trainer Job cancels its own replica Jobs; this is the second net
            log.warning("could not list the Jobs of launch %s: %s", self.plan.launch_id, error)
            return list(self.launched)
        return list(dict.fromkeys([*self.launched, *(job.id for job in listed)]))
