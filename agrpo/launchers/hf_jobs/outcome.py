"""What a Jobs run came to, read from the Jobs API and the run's folder at its end (I/O around pure cost.py).

`settle` waits (bounded) for the Jobs this launch cancelled to be over, so their running time is final; `run_files`
reads the trainer's metrics.json and log_history.json from the bucket (steps and samples trained); `end_report` puts
it together with the prices for terminal.end_lines. Nothing here raises: a run's end must not fail on its report.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from agrpo.launchers.hf_jobs.client import TERMINAL_STAGES, stage_of
from agrpo.launchers.hf_jobs.cost import job_costs, read_prices, samples_trained
from agrpo.launchers.hf_jobs.plan import JobsPlan
from agrpo.launchers.hf_jobs.terminal import end_lines, run_prefix

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 60.0  # a cancelled replica stops within seconds; its billed time is final once it is over
RESULT_FILES = ("metrics.json", "log_history.json")


def settle(api: Any, namespace: str, job_ids: list[str], poll_s: float, timeout_s: float = SETTLE_TIMEOUT_S) -> list:
    """The Jobs' last JobInfo, once each is over (or at the deadline, as they are then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        infos = [api.inspect_job(job_id=job_id, namespace=namespace) for job_id in job_ids]
        if all(stage_of(info) in TERMINAL_STAGES for info in infos) or time.monotonic() >= deadline:
            return infos
        time.sleep(max(0.2, min(poll_s, 2.0)))


def run_files(api: Any, bucket: str, prefix: str) -> dict[str, Any]:
    """metrics.json and log_history.json of the run's folder, parsed; those missing are left out."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="agrpo-results-") as folder:
        try:
            api.download_bucket_files(bucket, [(f"{prefix}/{name}", f"{folder}/{name}") for name in RESULT_FILES])
        except Exception as error:  # the trainer failed before writing them, or the bucket cannot be read
            log.info("could not read the run's metrics from bucket %s: %s", bucket, error)
        for name in RESULT_FILES:
            path = Path(folder) / name
            try:
                found[name] = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
    return found


def steps_and_samples(plan: JobsPlan, files: dict[str, Any]) -> tuple[int | None, int | None]:
    metrics, history = files.get("metrics.json") or {}, files.get("log_history.json") or []
    steps = metrics.get("global_step")
    samples = samples_trained(history, steps) if history else None
    if samples is None and steps and plan.after and plan.after.samples_per_step:
        samples = int(steps) * plan.after.samples_per_step
    return steps, samples


def end_report(plan: JobsPlan, api: Any, job_ids: list[str], stage: str, replay: list[str]) -> list[str]:
    """The end-of-run lines (terminal.end_lines), best effort: a line saying why when the figures cannot be read."""
    try:
        infos = settle(api, plan.namespace, job_ids, plan.watch.poll_interval_s)
        prices = read_prices(api)
        files = run_files(api, plan.bucket, run_prefix(plan)) if stage == "COMPLETED" else {}
        steps, samples = steps_and_samples(plan, files)
        return end_lines(plan, stage, job_costs(infos, prices), prices, steps, samples, replay)
    except Exception as error:  # the Hub is unreachable at the very end: say so, the run itself is over
        return [f"agrpo: HF Jobs run {plan.run_id}: its cost could not be read ({type(error).__name__}: {error})"]
