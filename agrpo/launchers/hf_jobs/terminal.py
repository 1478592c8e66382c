"""The launching terminal of a Jobs run reads like a local run's: the plan, a banner, each Job's stages, the trainer's
own console lines, and a summary with what the run cost and what to do next.

Everything else goes to files and the banner names them: on this machine `<run dir>/logs/launch.log` (every HTTP
request huggingface_hub makes, uploads, each Job's stage, a stand-in Hub's own lines); in the run's folder
`logs/install.log` (pip), `logs/trainer_job.log` (the trainer Job's launcher), `logs/trainer.log` (the trainer, every
library at full detail) and `logs/proxy.log`. Formatting is pure; `launch_console` is the one I/O part.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from agrpo.launchers.hf_jobs.after import next_commands
from agrpo.launchers.hf_jobs.cost import JobCost, Prices, cost_lines
from agrpo.launchers.hf_jobs.plan import JobsPlan

# Loggers whose INFO lines are details of a launch (kept in launch.log, off the terminal): the executor, readiness,
# the Hub client, and the Hub backend's own (its `detail_loggers`). What the terminal shows of them, the executor
# prints itself.
DETAIL_LOGGERS = ("agrpo.launchers.hf_jobs",)
JOB_LOGS = "logs/install.log (pip), logs/trainer_job.log, logs/trainer.log, logs/proxy.log"


class LaunchConsoleFilter(logging.Filter):
    """On the terminal: agrpo's own lines (the plan) but not a launch's details, and anyone's warnings and errors."""

    def __init__(self, detail_loggers: tuple[str, ...] = ()):
        super().__init__()
        self.details = (*DETAIL_LOGGERS, *detail_loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        name = record.name
        return (name == "agrpo" or name.startswith("agrpo.")) and not name.startswith(self.details)


@contextlib.contextmanager
def launch_console(log_file: str | None, detail_loggers: tuple[str, ...] = ()) -> Iterator[None]:
    """While a Jobs run is followed: the terminal filtered as above (`detail_loggers`: the Hub backend's own loggers,
    details too), every record at INFO and up in `log_file`."""
    root = logging.getLogger()
    streams = [h for h in root.handlers if type(h) is logging.StreamHandler]  # not the file handlers (subclasses)
    quiet = LaunchConsoleFilter(detail_loggers)
    for handler in streams:
        handler.addFilter(quiet)
    file_handler, level = None, root.level
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(file_handler)
        root.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield
    finally:
        for handler in streams:
            handler.removeFilter(quiet)
        if file_handler is not None:
            root.removeHandler(file_handler)
            file_handler.close()
            root.setLevel(level)


class JobLogView:
    """Which of the trainer Job's lines the launching terminal shows: all but the in-Job summary's `next:` block,
    whose paths exist only inside the Job (this machine prints its own, after the run)."""

    def __init__(self):
        self.skipping = False

    def shows(self, line: str) -> bool:
        if line.strip() == "next:":
            self.skipping = True
            return False
        if self.skipping and line.startswith("  "):
            return False
        self.skipping = False
        return True


def run_prefix(plan: JobsPlan) -> str:
    """The run's folder in the bucket (`RUN_ID`, or a deeper path when sync.output_dir is one)."""
    return plan.config.path_in_bucket.rsplit("/", 1)[0]


def banner_lines(plan: JobsPlan) -> list[str]:
    total, unknown = plan.cost_per_hour()
    where = " (every Job on this machine, nothing billed)" if plan.jobs_on_this_machine else ""
    lines = [
        f"agrpo: HF Jobs run {plan.run_id}: {len(plan.replicas)} replica Job(s) + 1 trainer Job in {plan.namespace}"
        + where,
        f"  run folder   hf://buckets/{plan.bucket}/{run_prefix(plan)}  ({plan.run_dir} inside the Jobs)",
    ]
    if plan.after and plan.after.launch_log:
        lines.append(f"  launch log   {plan.after.launch_log}  (HTTP requests, uploads, Job stages)")
    lines.append(f"  Job logs     {JOB_LOGS} in the run folder; `agrpo jobs logs {plan.run_id}`")
    unpriced = f"; no price for {', '.join(unknown)}" if unknown else ""
    lines.append(f"  while up     ~${total:.2f}/hour for all Jobs (agrpo's price table{unpriced})")
    return lines


def end_lines(
    plan: JobsPlan,
    stage: str,
    costs: list[JobCost],
    prices: Prices,
    steps: int | None,
    samples: int | None,
    replay: list[str],
) -> list[str]:
    """The end of a Jobs run: how the trainer ended, what the Jobs cost, and (when it completed) what to do next."""
    done = stage == "COMPLETED"
    lines = [
        f"agrpo: HF Jobs run {plan.run_id} {'done' if done else 'over'}: trainer Job {stage}"
        + (f", {steps} steps" if steps else "")
    ]
    label = "would cost" if plan.jobs_on_this_machine else "cost"
    lines += cost_lines(costs, prices, samples if done else None, label=label)
    if plan.jobs_on_this_machine:
        lines.append("  (Jobs on this machine bill nothing: this is what these Jobs would cost on their flavors)")
    if done and plan.after:
        lines += next_commands(plan.after, plan.run_id, plan.namespace, replay)
    return lines
