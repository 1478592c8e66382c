"""Wait until every replica Job serves: its stage is RUNNING and /health answers 200 through the exposed URL.

The loop is pure (stage lookup, health probe, clock and sleep are passed in) so its failure modes are unit-tested:
a replica whose Job ends before it is healthy fails at once, naming the Job and its status message; a replica
that stays unhealthy fails at the deadline with its last answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.client import TERMINAL_STAGES


@dataclass
class ReplicaJob:
    name: str
    job_id: str
    url: str


class ReplicaNotReady(LaunchError):
    """One replica will not serve; `replica` says which, the message says why."""

    def __init__(self, replica: ReplicaJob, why: str):
        super().__init__(f"replica {replica.name} (Job {replica.job_id}) {why}")
        self.replica = replica


def probe_health(url: str, token: str | None, timeout_s: float = 10.0) -> tuple[bool, str]:
    """GET <url>/health with the HF token (the Jobs proxy requires it). Returns (healthy, what was seen)."""
    import requests

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(f"{url.rstrip('/')}/health", headers=headers, timeout=timeout_s)
    except requests.RequestException as error:
        return False, f"{type(error).__name__}"
    return response.status_code == 200, f"HTTP {response.status_code}"


def wait_until_ready(
    replicas: list[ReplicaJob],
    stage: Callable[[str], tuple[str, str | None]],
    probe: Callable[[str], tuple[bool, str]],
    timeout_s: float,
    poll_interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_ready: Callable[[ReplicaJob, float], None] | None = None,
) -> float:
    """Block until every replica is healthy; return the seconds it took. Raises ReplicaNotReady."""
    start = clock()
    pending = {r.job_id: r for r in replicas}
    last_seen = {r.job_id: "not probed yet" for r in replicas}
    while True:
        for job_id, replica in list(pending.items()):
            current, message = stage(job_id)
            if current in TERMINAL_STAGES:
                why = f": {message}" if message else ""
                raise ReplicaNotReady(replica, f"ended with stage {current} before it was healthy{why}")
            if current != "RUNNING":
                last_seen[job_id] = f"stage {current}"
                continue
            healthy, seen = probe(replica.url)
            last_seen[job_id] = f"stage RUNNING, /health {seen}"
            if healthy:
                del pending[job_id]
                if on_ready:
                    on_ready(replica, clock() - start)
        if not pending:
            return clock() - start
        if clock() - start >= timeout_s:
            replica = next(iter(pending.values()))
            raise ReplicaNotReady(
                replica,
                f"was not healthy after {timeout_s:.0f} s (last: {last_seen[replica.job_id]}); "
                "raise launcher.hf_jobs.ready_timeout_s if the model is large",
            )
        sleep(poll_interval_s)
