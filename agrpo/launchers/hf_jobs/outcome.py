"""What a Jobs run came to, read from the Jobs API and the run's folder at its end (I/O around pure cost.py).

`settle` waits (bounded) for the Jobs this launch cancelled to be over, so their running time is final; `run_files`
reads the trainer's metrics.json and log_history.json from the bucket (steps and samples trained); `end_report` puts
it together with the prices for terminal.end_lines. Nothing here raises: a run's end must not fail on its report;
the files are typed at agrpo/interprocess.py's boundary (a bad one reads as missing, counted and logged once).
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from agrpo.fleet.cost import FleetBill, fleet_cost_lines
from agrpo.fleet.files import STATE_RECORD
from agrpo.interprocess import LOG_HISTORY, RUN_METRICS, read_record
from agrpo.launchers.hf_jobs.client import TERMINAL_STAGES, stage_of
from agrpo.launchers.hf_jobs.cost import job_costs, read_prices, samples_trained
from agrpo.launchers.hf_jobs.plan import JobsPlan
from agrpo.launchers.hf_jobs.terminal import end_lines, run_prefix

log = logging.getLogger(__name__)
SETTLE_TIMEOUT_S = 60.0  # a cancelled replica stops within seconds; its billed time is final once it is over
RESULT_FILES = ("metrics.json", "log_history.json")
FLEET_STATE = "fleet/state.json"  # inference.replicas=auto: the trainer Job's fleet controller's last figures
RECORDS = {"metrics.json": (RUN_METRICS, "null"), "log_history.json": (LOG_HISTORY, "null")}


def settle(api: Any, namespace: str, job_ids: list[str], poll_s: float, timeout_s: float = SETTLE_TIMEOUT_S) -> list:
    """The Jobs' last JobInfo, once each is over (or at the deadline, as they are then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        infos = [api.inspect_job(job_id=job_id, namespace=namespace) for job_id in job_ids]
        if all(stage_of(info) in TERMINAL_STAGES for info in infos) or time.monotonic() >= deadline:
            return infos
        time.sleep(max(0.2, min(poll_s, 2.0)))


def run_files(api: Any, bucket: str, prefix: str, names: tuple[str, ...] = RESULT_FILES) -> dict[str, Any]:
    """The run folder's `names` (metrics.json and log_history.json), parsed; those missing are left out."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="agrpo-results-") as folder:
        for name in names:
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            api.download_bucket_files(bucket, [(f"{prefix}/{name}", f"{folder}/{name}") for name in names])
        except Exception as error:  # the trainer failed before writing them, or the bucket cannot be read
            log.info("could not read the run's metrics from bucket %s: %s", bucket, error)
        for name in names:
            check, non_finite = RECORDS.get(name, (STATE_RECORD, "reject"))
            value = read_record(Path(folder) / name, check, non_finite=non_finite)
            if value is not None:
                found[name] = value
    return found


def steps_and_samples(plan: JobsPlan, files: dict[str, Any]) -> tuple[int | None, int | None]:
    metrics, history = files.get("metrics.json") or {}, files.get("log_history.json") or []
    steps = metrics.get("global_step")
    samples = samples_trained(history, steps) if history else None
    if samples is None and steps and plan.after and plan.after.samples_per_step:
        samples = int(steps) * plan.after.samples_per_step
    return steps, samples


def fleet_lines(plan: JobsPlan, state: dict[str, Any] | None, prices: Any, samples: int | None) -> list[str]:
    """inference.replicas=auto: replica-seconds by fleet size and what they cost at the replica flavor's price,
    beside the largest fixed fleet for the same run (agrpo/fleet/cost.py), from the trainer Job's fleet/state.json."""
    if not state:
        return ["  fleet        no figures (the trainer Job wrote no fleet/state.json)"]
    flavor = plan.fleet.replica.flavor
    bill = FleetBill(
        dict(state.get("seconds_by_size", {})),  # typed: {size: seconds} (fleet/files.py STATE_RECORD)
        int(state.get("max_replicas", plan.fleet.max_replicas)),
        state.get("samples") or samples or None,  # the samples the fleet's seconds were counted over
        prices.of(flavor),
        f"{flavor}, {prices.source}",
    )
    head = f"  fleet        {plan.fleet.min_replicas}..{plan.fleet.max_replicas} replica Jobs (auto)"
    if state.get("lost"):
        head += f"; {state['lost']} lost, {state.get('replaced', 0)} replaced"
    return [head, *fleet_cost_lines(bill)]


def end_report(plan: JobsPlan, api: Any, job_ids: list[str], stage: str, replay: list[str]) -> list[str]:
    """The end-of-run lines (terminal.end_lines), best effort: a line saying why when the figures cannot be read."""
    try:
        infos = settle(api, plan.namespace, job_ids, plan.watch.poll_interval_s)
        prices = read_prices(api)
        names = RESULT_FILES + ((FLEET_STATE,) if plan.fleet is not None else ())
        files = run_files(api, plan.bucket, run_prefix(plan), names) if stage == "COMPLETED" or plan.fleet else {}
        steps, samples = steps_and_samples(plan, files) if stage == "COMPLETED" else (None, None)
        lines = end_lines(plan, stage, job_costs(infos, prices), prices, steps, samples, replay)
        if plan.fleet is not None:
            at = next((i for i, line in enumerate(lines) if line.startswith("next (on this machine)")), len(lines))
            lines[at:at] = fleet_lines(plan, files.get(FLEET_STATE), prices, samples)
        return lines
    except Exception as error:  # the Hub is unreachable at the very end: say so, the run itself is over
        return [f"agrpo: HF Jobs run {plan.run_id}: its cost could not be read ({type(error).__name__}: {error})"]
