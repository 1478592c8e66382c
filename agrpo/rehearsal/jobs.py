"""The stand-in's Jobs as data (pure): stages, what ends a Job, requeue, label filters, exposed-port host names.

A Job is SCHEDULING until its process starts, then RUNNING; it ends COMPLETED (exit 0), ERROR (non-zero exit,
timeout, preemption) or CANCELED (cancel_job). A Job created with attempts > 1 that ends in ERROR is requeued
(RUNNING again after a short ERROR) until its attempts are spent, as the platform does for a failed or preempted
Job. Cancelling a Job that is over changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
EXPOSED_HOST = re.compile(r"(?P<job_id>[0-9a-f]+)--(?P<port>\d+)\.hf\.jobs")
EXPOSED_PATH = re.compile(r"/expose/(?P<job_id>[0-9a-f]+)/(?P<port>\d+)(?P<rest>/.*)?")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class JobRecord:
    """One Job: what run_job sent (`spec`, secret values included: they never leave the stand-in) and its state."""

    id: str
    namespace: str
    spec: dict[str, Any]
    created: float
    stage: str = "SCHEDULING"
    message: str | None = None
    attempt: int = 1
    started: float | None = None
    finished: float | None = None
    cancel_requested: bool = False
    history: list[str] = field(default_factory=list)  # every stage it went through, in order
    ran_s: float = 0.0  # running time of the attempts before the current one (what the flavor's price is paid for)

    @property
    def attempts(self) -> int:
        return int(self.spec.get("attempts") or 1)

    @property
    def timeout_s(self) -> float | None:
        value = self.spec.get("timeoutSeconds")
        return float(value) if value else None

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.spec.get("labels") or {})

    @property
    def exposed_ports(self) -> list[int]:
        return [int(p) for p in (self.spec.get("expose") or {}).get("ports", [])]

    def running_s(self, now: float) -> float:
        """Seconds this Job has run, over every attempt (the billed time)."""
        current = now - self.started if self.stage == "RUNNING" and self.started is not None else 0.0
        return self.ran_s + max(0.0, current)

    def move(self, stage: str, message: str | None = None, now: float | None = None) -> None:
        if self.stage == "RUNNING" and stage != "RUNNING" and self.started is not None and now is not None:
            self.ran_s += max(0.0, now - self.started)
        self.stage, self.message = stage, message
        self.history.append(stage)
        if stage == "RUNNING":
            self.started = now
        if stage in TERMINAL:
            self.finished = now

    def to_json(self, gateway: str | None = None, now: float | None = None) -> dict[str, Any]:
        """The body huggingface_hub's JobInfo parses; secrets by name only, as the Hub answers. With `now`, the
        Hub's `durations` too (seconds scheduling, running over every attempt, in all)."""
        spec = self.spec
        status: dict[str, Any] = {"stage": self.stage, "message": self.message}
        if gateway and self.exposed_ports:
            status["exposeUrls"] = [exposed_url(self.id, port, gateway) for port in self.exposed_ports]
        body = {
            "id": self.id,
            "createdAt": iso(self.created),
            "dockerImage": spec.get("dockerImage"),
            "command": spec.get("command"),
            "arguments": spec.get("arguments", []),
            "environment": spec.get("environment", {}),
            "secrets": {k: None for k in spec.get("secrets") or {}},
            "flavor": spec.get("flavor"),
            "labels": spec.get("labels"),
            "volumes": spec.get("volumes"),
            "status": status,
            "owner": {"id": self.namespace, "name": self.namespace, "type": "user"},
            "expose": spec.get("expose"),
        }
        if self.started is not None:
            body["startedAt"] = iso(self.started)
        if self.finished is not None:
            body["finishedAt"] = iso(self.finished)
        if now is not None:
            end = self.finished if self.stage in TERMINAL and self.finished is not None else now
            running = self.running_s(end)
            body["durations"] = {
                "schedulingSecs": round(max(0.0, end - self.created - running)),
                "runningSecs": round(running),
                "totalSecs": round(end - self.created),
            }
        return body


def outcome(returncode: int, job: JobRecord, reason: str | None) -> tuple[str, str | None]:
    """(stage, message) of a Job whose process ended: `reason` says the stand-in ended it (cancel/timeout/preempt)."""
    if reason == "cancel" or job.cancel_requested:
        return "CANCELED", "canceled by user"
    if reason == "timeout":
        return "ERROR", f"Job timeout after {job.timeout_s:.0f} s"
    if reason == "preempt":
        return "ERROR", "preempted (rehearsal)"
    if returncode == 0:
        return "COMPLETED", None
    return "ERROR", f"exit code {returncode}"


def requeues(job: JobRecord, stage: str) -> bool:
    """Whether the platform reruns this Job after it ended in `stage`."""
    return stage == "ERROR" and not job.cancel_requested and job.attempt < job.attempts


def timed_out(job: JobRecord, now: float) -> bool:
    return (
        job.stage == "RUNNING"
        and job.timeout_s is not None
        and job.started is not None
        and now - job.started >= job.timeout_s
    )


def due_for_preemption(job: JobRecord, now: float, after_s: float | None, role: str = "trainer") -> bool:
    """rehearsal(preempt_trainer_after_s=...), a knob for tests: the first attempt of the Job labelled agrpo-role=<role> is
    killed once it has run that long (later attempts run undisturbed, so the requeued one can finish)."""
    return (
        after_s is not None
        and job.attempt == 1
        and job.labels.get("agrpo-role") == role
        and job.stage == "RUNNING"
        and job.started is not None
        and now - job.started >= after_s
    )


def matches_labels(job: JobRecord, wanted: list[str]) -> bool:
    """list_jobs(labels=...) sends each as `label=key=value`; a Job matches when it has all of them."""
    labels = job.labels
    for item in wanted:
        key, _, value = item.partition("=")
        if labels.get(key) != value:
            return False
    return True


def exposed_host(job_id: str, port: int) -> str:
    return f"{job_id}--{port}.hf.jobs"


def exposed_url(job_id: str, port: int, gateway: str) -> str:
    """The URL form a Job's exposed port has in rehearsal: the real host name, http, the stand-in's gateway port
    (`gateway` is 'host:port'; the name resolves to the gateway inside rehearsal Jobs)."""
    return f"http://{exposed_host(job_id, port)}:{gateway.rsplit(':', 1)[1]}"


def route(host: str | None, path: str) -> tuple[str, int, str] | None:
    """(job id, port, path to forward) for a gateway request: by Host (`<job_id>--<port>.hf.jobs[:p]`) or, for
    callers that cannot resolve that name (the launching process), by path (`/expose/<job_id>/<port>/...`)."""
    if host:
        found = EXPOSED_HOST.fullmatch(host.rsplit(":", 1)[0] if ":" in host else host)
        if found:
            return found["job_id"], int(found["port"]), path
    found = EXPOSED_PATH.fullmatch(path.split("?", 1)[0])
    if found:
        query = ("?" + path.split("?", 1)[1]) if "?" in path else ""
        return found["job_id"], int(found["port"]), (found["rest"] or "/") + query
    return None


def path_form(url: str, gateway: str) -> str:
    """`http://<job_id>--<port>.hf.jobs:<p>` as `http://<gateway>/expose/<job_id>/<port>` (no name to resolve)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    found = EXPOSED_HOST.fullmatch(host)
    if not found:
        return url
    return f"http://{gateway}/expose/{found['job_id']}/{found['port']}"
