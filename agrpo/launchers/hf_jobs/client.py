"""The few Hub calls the HF Jobs launcher, the trainer Job and `agrpo jobs` share, on huggingface_hub's HfApi.

Every Job of a run carries the label agrpo-run=<run_id>, so finding and cancelling a run needs nothing but its id.
The token is read by huggingface_hub (HF_TOKEN or the saved login) and only ever leaves this process as a Job
secret value or an Authorization header.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Iterable

from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.plan import LAUNCH_LABEL, ROLE_LABEL, RUN_LABEL, TOKEN_SECRET

log = logging.getLogger(__name__)
TERMINAL_STAGES = ("COMPLETED", "CANCELED", "ERROR", "DELETED")


def make_api() -> Any:
    """An HfApi on HF_ENDPOINT as set now (huggingface_hub reads it only at import; tests set it later)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def hf_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def resolve_namespace(api: Any, configured: str | None) -> str:
    if configured:
        return configured
    try:
        return api.whoami()["name"]
    except Exception as error:  # no token, or a token the Hub refuses
        raise LaunchError(
            "cannot tell which namespace to run the Jobs in: log in (`hf auth login`) or set HF_TOKEN, "
            f"or set launcher.hf_jobs.namespace ({type(error).__name__})"
        ) from None


def secret_values(names: Iterable[str], token: str | None = None) -> dict[str, str]:
    """The value of every secret, from this machine's environment (HF_TOKEN: `token` when given, else the saved
    token)."""
    values, missing = {}, []
    for name in dict.fromkeys(names):
        value = (token or hf_token()) if name == TOKEN_SECRET else os.environ.get(name)
        if value:
            values[name] = value
        else:
            missing.append(name)
    if missing:
        raise LaunchError(
            f"no value for the Job secret(s) {missing}: set them in the environment of this machine "
            "(HF_TOKEN: or log in with `hf auth login`), or remove them from launcher.hf_jobs.secrets"
        )
    return values


def stage_of(job: Any) -> str:
    stage = job.status.stage
    return getattr(stage, "value", str(stage))


def run_jobs(api: Any, namespace: str, run_id: str, role: str | None = None, launch_id: str | None = None) -> list[Any]:
    """Every Job labelled with this run id (optionally one role, one launch), oldest first."""
    labels = {RUN_LABEL: run_id}
    if role:
        labels[ROLE_LABEL] = role
    if launch_id:
        labels[LAUNCH_LABEL] = launch_id
    jobs = list(api.list_jobs(labels=labels, namespace=namespace))
    return sorted(jobs, key=lambda job: (job.created_at is None, job.created_at or 0, job.id))


def cancel_jobs(api: Any, namespace: str, job_ids: Iterable[str]) -> list[str]:
    """Cancel every Job that is not over yet; never raises (it runs on the way out). Returns the ids cancelled."""
    cancelled = []
    for job_id in dict.fromkeys(job_ids):
        try:
            if stage_of(api.inspect_job(job_id=job_id, namespace=namespace)) in TERMINAL_STAGES:
                continue
            api.cancel_job(job_id=job_id, namespace=namespace)
            cancelled.append(job_id)
        except Exception as error:  # keep cancelling the others
            log.error("could not cancel Job %s: %s (cancel it with `agrpo jobs cancel` or on the Hub)", job_id, error)
    return cancelled


def cancel_run(api: Any, namespace: str, run_id: str, role: str | None = None) -> list[str]:
    return cancel_jobs(api, namespace, [job.id for job in run_jobs(api, namespace, run_id, role)])


def log_tail(api: Any, namespace: str, job_id: str, lines: int = 20) -> list[str]:
    """The last lines a Job logged, best-effort (for error messages)."""
    try:
        return list(itertools.islice(api.fetch_job_logs(job_id=job_id, namespace=namespace, tail=lines), lines))
    except Exception:
        return []
