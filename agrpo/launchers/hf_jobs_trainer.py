"""Inside the trainer Job (launcher=hf_jobs role=trainer): resume from the bucket, train, then cancel the replicas.

The trainer Job, not the machine that launched it, cancels the replicas when it ends, so a closed laptop never
leaves GPUs billing. With launcher.hf_jobs.trainer_attempts > 1 the platform reruns a failed or preempted trainer;
each attempt counts itself in the run folder, and only a success or the last attempt cancels the replicas, so a
requeued trainer finds them still serving and resumes from the latest checkpoint in the bucket.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from agrpo.launchers.hf_jobs_client import cancel_run, make_api
from agrpo.launchers.hf_jobs_plan import LAUNCH_ID_ENV
from agrpo.sync.resume import prepare_resume
from agrpo.sync.storage import BucketStorage, LocalDirStorage

log = logging.getLogger(__name__)
ATTEMPTS_FILE = ".agrpo/trainer_attempt.json"


def next_attempt(previous: dict[str, Any] | None, launch_id: str) -> dict[str, Any]:
    """The attempt record after this start: counting goes on within one launch and restarts with a new one."""
    if previous and previous.get("launch_id") == launch_id:
        return {"launch_id": launch_id, "attempt": int(previous.get("attempt", 0)) + 1}
    return {"launch_id": launch_id, "attempt": 1}


def record_attempt(storage: BucketStorage, launch_id: str) -> int:
    try:
        previous = json.loads(storage.read_text(ATTEMPTS_FILE))
    except (FileNotFoundError, ValueError):
        previous = None
    record = next_attempt(previous, launch_id)
    storage.write_text(ATTEMPTS_FILE, json.dumps(record))
    return record["attempt"]


def prepare_trainer(cfg: Any, storage: BucketStorage) -> int:
    """Resume state and attempt number for this start; sets trainer.resume when the bucket holds a checkpoint."""
    state = prepare_resume(storage)
    if state.checkpoint is not None:
        cfg.trainer.resume = True
        log.info("resuming run %s from %s in the bucket", cfg.launcher.hf_jobs.run_id, state.checkpoint)
    return record_attempt(storage, os.environ.get(LAUNCH_ID_ENV, ""))


def run_trainer_job(cfg: Any, local_plan: Any, execute_local: Any, api: Any = None) -> dict[str, Any]:
    """Run the local trainer plan (proxy + trainer against the replica URLs) and clean up the run's replicas."""
    jobs = cfg.launcher.hf_jobs
    attempt = prepare_trainer(cfg, LocalDirStorage(cfg.sync.output_dir))
    last = attempt >= jobs.trainer_attempts
    log.info("trainer attempt %d of %d", attempt, jobs.trainer_attempts)
    succeeded = False
    try:
        result = execute_local(cfg, local_plan)
        succeeded = True
        return result
    finally:
        if succeeded or last:
            api = api or make_api()
            cancelled = cancel_run(api, jobs.namespace, jobs.run_id, role="replica")
            log.info("cancelled %d replica Job(s) of run %s", len(cancelled), jobs.run_id)
        else:
            log.warning("attempt %d of %d failed: the replicas stay up for the requeued trainer", attempt,
                        jobs.trainer_attempts)
