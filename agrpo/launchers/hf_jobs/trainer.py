"""Inside the trainer Job: `python -m agrpo.launchers.hf_jobs.trainer <run dir>/config.yaml`.

It reads the run config the launcher resolved and uploaded (never re-composed from overrides), finds the replica
Jobs of its launch by label, then resumes from the bucket, runs proxy + trainer, and cancels the replicas.

The trainer Job, not the machine that launched it, cancels the replicas when it ends, so a closed laptop never
leaves GPUs billing. With launcher.hf_jobs.trainer_attempts > 1 the platform reruns a failed or preempted trainer;
each attempt counts itself in the run folder, and only a success or the last attempt cancels the replicas, so a
requeued trainer finds them still serving and resumes from the latest checkpoint in the bucket.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from agrpo.config.schema import InferenceConfig, RunConfig
from agrpo.config.spec import with_values
from agrpo.config.schema.inference import is_auto_fleet
from agrpo.errors import AgrpoError, LaunchError
from agrpo.interprocess import BadInput, integer, parse_record
from agrpo.interprocess import record as record_of
from agrpo.interprocess import text as text_field
from agrpo.launchers.hf_jobs.client import cancel_jobs, cancel_run, make_api, run_jobs, stage_of
from agrpo.launchers.hf_jobs.plan import LAUNCH_ID_ENV
from agrpo.sync.resume import prepare_resume
from agrpo.sync.storage import BucketStorage, LocalDirStorage

log = logging.getLogger("agrpo.launchers.hf_jobs.trainer")  # by name: as `python -m` this module is __main__
ATTEMPTS_FILE = ".agrpo/trainer_attempt.json"
JOB_LOG = "logs/trainer_job.log"  # this launcher's full log, in the run's folder


def job_console() -> None:
    """The Job's console as a local run's: agrpo's own lines, and other libraries' warnings (not huggingface_hub's
    every HTTP request); `keep_job_log` adds the full log in the run's folder once the config says where."""
    from agrpo.trainer.console.logs import ConsoleFilter, ConsoleFormatter

    console = logging.StreamHandler(sys.stderr)
    console.addFilter(ConsoleFilter(logging.INFO))
    console.setFormatter(ConsoleFormatter())
    root = logging.getLogger()
    root.addHandler(console)
    root.setLevel(logging.INFO)


def keep_job_log(run_dir: str) -> None:
    from agrpo.trainer.console.logs import FILE_FORMAT

    path = os.path.join(run_dir, JOB_LOG)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as error:  # the bucket mount refuses: the console still has agrpo's lines
        log.warning("cannot write %s: %s", path, error)
        return
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logging.getLogger().addHandler(handler)


def next_attempt(previous: dict[str, Any] | None, launch_id: str) -> dict[str, Any]:
    """The attempt record after this start: counting goes on within one launch and restarts with a new one."""
    if previous and previous.get("launch_id") == launch_id:
        return {"launch_id": launch_id, "attempt": int(previous.get("attempt", 0)) + 1}
    return {"launch_id": launch_id, "attempt": 1}


def record_attempt(storage: BucketStorage, launch_id: str) -> int:
    try:  # written by an earlier attempt of this Job: parsed at the guarded boundary, a bad one counts as none
        text = storage.read_text(ATTEMPTS_FILE)
        previous = parse_record(text, record_of({"launch_id": text_field, "attempt": integer}))
    except (FileNotFoundError, BadInput):
        previous = None
    record = next_attempt(previous, launch_id)
    storage.write_text(ATTEMPTS_FILE, json.dumps(record))
    return record["attempt"]


def prepare_trainer(cfg: RunConfig, storage: BucketStorage) -> tuple[RunConfig, int]:
    """(the spec this start trains from, its attempt number): trainer.resume is true when the bucket holds a
    checkpoint, which only this start can know (a requeued attempt finds its predecessor's)."""
    state = prepare_resume(storage)
    if state.checkpoint is not None:
        cfg = with_values(cfg, {"trainer.resume": "true"})
        log.info("resuming run %s from %s in the bucket", cfg.launcher.hf_jobs.run_id, state.checkpoint)
    return cfg, record_attempt(storage, os.environ.get(LAUNCH_ID_ENV, ""))


def run_trainer_job(cfg: RunConfig, local_plan: Any, execute_local: Any, api: Any = None) -> dict[str, Any]:
    """Run the local trainer plan (proxy + trainer against the replica URLs) and clean up the run's replicas.

    `local_plan` may be the plan builder: it is then called once the resume state is known, because the plan
    carries the config.yaml the trainer reads, which must say whether to resume (a requeued attempt restarted at v1
    against replicas that still held v1.. when the plan was built first)."""
    jobs = cfg.launcher.hf_jobs
    cfg, attempt = prepare_trainer(cfg, LocalDirStorage(cfg.sync.output_dir))
    if callable(local_plan):
        local_plan = local_plan(cfg)
    last = attempt >= jobs.trainer_attempts
    log.info("trainer attempt %d of %d", attempt, jobs.trainer_attempts)
    succeeded = False
    try:
        result = execute_local(local_plan)
        succeeded = True
        return result
    finally:
        if succeeded or last:
            api = api or make_api()
            cancelled = cancel_run(api, jobs.namespace, jobs.run_id, role="replica")
            log.info("cancelled %d replica Job(s) of run %s", len(cancelled), jobs.run_id)
        else:
            log.warning(
                "attempt %d of %d failed: the replicas stay up for the requeued trainer", attempt, jobs.trainer_attempts
            )


def expected_replicas(inference: InferenceConfig, found: int) -> bool:
    """Whether the trainer can start on `found` running replica Jobs: the fixed number; with inference.replicas=auto
    any number up to max_replicas but none (a requeued attempt finds those its predecessor added; below min_replicas
    the fleet replaces the missing ones)."""
    if not is_auto_fleet(inference):
        return found == int(inference.replicas)
    return 1 <= found <= int(inference.max_replicas)


def fleet_range(inference: InferenceConfig) -> str:
    if not is_auto_fleet(inference):
        return ""
    return f" (1..inference.max_replicas={inference.max_replicas} to start on)"


def with_jobs_fleet(build_plan: Any, api: Any) -> Any:
    """The in-Job plan builder, plus (inference.replicas=auto) the fleet of replica Jobs its controller sizes."""

    def build(cfg: RunConfig) -> Any:
        plan = build_plan(cfg)
        if is_auto_fleet(cfg.inference):
            from agrpo.launchers.hf_jobs.fleet_jobs import jobs_fleet_plan

            plan.fleet = jobs_fleet_plan(cfg, api)
        return plan

    return build


def replica_urls(cfg: RunConfig, api: Any, launch_id: str) -> list[str]:
    """The exposed URLs of this launch's running replica Jobs (the launcher waited until they served)."""
    jobs = cfg.launcher.hf_jobs
    try:
        listed = run_jobs(api, jobs.namespace, jobs.run_id, role="replica", launch_id=launch_id or None)
    except Exception as error:  # HTTP or network: one line, then the Job ends (and the platform may requeue it)
        first = (str(error).splitlines() or [""])[0]
        raise LaunchError(
            f"the trainer Job could not list the replica Jobs of run {jobs.run_id} in "
            f"{jobs.namespace} ({type(error).__name__}: {first})"
        ) from None
    found = [job for job in listed if stage_of(job) == "RUNNING"]
    if not expected_replicas(cfg.inference, len(found)):
        cancel_jobs(api, jobs.namespace, [job.id for job in found])  # no run without all of them: stop the billing
        raise LaunchError(
            f"the trainer Job found {len(found)} running replica Job(s) of run {jobs.run_id} (launch "
            f"{launch_id}) where inference.replicas={cfg.inference.replicas}{fleet_range(cfg.inference)}: they "
            "ended or were "
            "cancelled (those found are cancelled too); launch the run again (same "
            "launcher.hf_jobs.run_id to resume)"
        )
    return [jobs.replica_url.format(job_id=job.id, port=jobs.replica_port) for job in found]


def load_job_config(path: str, api: Any) -> RunConfig:
    """The uploaded run config, with this launch's replica URLs filled in, prepared (validated, then resolved for
    this machine: agrpo/config/prepare.py) as every entrypoint prepares its config."""
    from agrpo.config.prepare import prepare
    from agrpo.config.spec import read_config, spec_of

    cfg = read_config(path)  # the mutable, composed form: prepare's input, as Hydra's is for `python -m agrpo`
    cfg.inference.urls = replica_urls(spec_of(cfg), api, os.environ.get(LAUNCH_ID_ENV, ""))
    return prepare(cfg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agrpo.launchers.hf_jobs.trainer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("config", help="<run dir>/config.yaml, uploaded by the launcher")
    args = parser.parse_args(argv)
    job_console()
    from agrpo.launchers.base import get_launcher

    try:
        api = make_api()
        cfg = load_job_config(args.config, api)
        keep_job_log(str(cfg.sync.output_dir))
        inner = get_launcher(cfg.launcher.hf_jobs.trainer_launcher)
        run_trainer_job(cfg, with_jobs_fleet(inner.build_plan, api), inner.execute, api=api)
    except AgrpoError as error:
        print(f"agrpo trainer Job: error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
