"""A fake Hugging Face Hub on 127.0.0.1 for the HF Jobs launcher, `agrpo pull` and bucket-sync tests.

The real Hub cannot be reached from these machines. This is the rehearsal's own stand-in of the Hub API
(agrpo/rehearsal/hub_api.py: the same routes, the same token check on every route, the same
refusals of what the Jobs API refuses: unknown flavors, bad labels, mounting a bucket that does not exist) over a
scripted state instead of real processes, plus the Jobs proxy's exposed ports (`/expose/<job_id>/<port>/health`,
standing in for https://<job_id>--<port>.hf.jobs). It records every request, so tests assert the exact bodies the
launcher sent.

Scenario knobs per Job (set in `on_create`, a callback that sees the created Job): `stage`, `message`, `healthy`,
`logs` (lines served by /logs), `stage_after_logs` (the stage a Job moves to once its logs were streamed) and
`running_s` (the running time its `durations` report). A bucket is backed by a local folder (the "mount");
`hidden_polls` hides a file from the listing for its first N listings, like the Hub's listing lagging behind an
upload. `prices` is the hardware list's $/hour per flavor; `hardware_down=True` makes that list unreachable.

Transfers: huggingface_hub moves bucket files through Xet's native client, which cannot be faked over plain HTTP, so
`use_fake_hub` replaces `HfApi.batch_bucket_files` and `HfApi.download_bucket_files` with the stand-in's plain-HTTP
transfers (rehearsal/plain_transfer.py); uploads are recorded in `uploads` and written into the bucket's folder. A
child process gets the same replacement from tests/fakes/child/sitecustomize.py (FAKE_HUB_UPLOADS=1).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from agrpo.rehearsal.hub_api import HubBackend, Request, hub_handler
from agrpo.rehearsal.hub_rules import hardware_list
from agrpo.rehearsal.plain_transfer import plain_batch_bucket_files, plain_download_bucket_files

NAMESPACE = "alice"
FAKE_TOKEN = "hf_FAKE_secret_token_value_123"  # a value no test output may ever contain


@dataclass
class FakeJob:
    id: str
    namespace: str
    spec: dict[str, Any]
    stage: str = "RUNNING"
    message: str | None = None
    healthy: bool = True
    logs: list[str] = field(default_factory=list)
    stage_after_logs: str | None = None
    created_at: str = ""
    running_s: float | None = None  # what its `durations` report as running time (None: no durations)

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "id": self.id,
            "createdAt": self.created_at,
            "dockerImage": spec.get("dockerImage"),
            "command": spec.get("command"),
            "arguments": spec.get("arguments", []),
            "environment": spec.get("environment", {}),
            "secrets": {k: None for k in spec.get("secrets", {})},
            "flavor": spec.get("flavor"),
            "labels": spec.get("labels"),
            "volumes": spec.get("volumes"),
            "status": {"stage": self.stage, "message": self.message},
            "owner": {"id": "u1", "name": self.namespace, "type": "user"},
            "expose": spec.get("expose"),
            **(
                {"durations": {"schedulingSecs": 0, "runningSecs": self.running_s, "totalSecs": self.running_s}}
                if self.running_s is not None
                else {}
            ),
        }


def trainer_completes(*lines: str) -> Callable[[FakeJob], None]:
    """An `on_create` under which the trainer Job streams `lines` and then COMPLETES (replicas keep running)."""

    def on_create(job: FakeJob) -> None:
        if job.spec["labels"]["agrpo-role"] == "trainer":
            job.logs, job.stage_after_logs = list(lines), "COMPLETED"

    return on_create


class FakeHub(HubBackend):
    def __init__(self, on_create: Callable[[FakeJob], None] | None = None, prices: dict[str, float] | None = None):
        from agrpo.launchers.hf_jobs.plan import PRICE_PER_HOUR_USD

        self.namespace, self.token = NAMESPACE, FAKE_TOKEN
        self.requests: list[Request] = []
        self.jobs: dict[str, FakeJob] = {}
        self.created_bodies: list[dict[str, Any]] = []
        self.buckets: dict[str, Path | None] = {}
        self.hidden_polls: dict[str, int] = {}  # bucket path -> listings still to hide it from
        self.list_calls = 0
        self.uploads: dict[str, dict[str, bytes]] = {}  # bucket id -> path in bucket -> bytes
        self.on_create = on_create
        self.prices = dict(PRICE_PER_HOUR_USD if prices is None else prices)
        self.hardware_down = False
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), hub_handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- test helpers
    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def replica_url_template(self) -> str:
        return self.url + "/expose/{job_id}/{port}"

    def calls(self, method: str, path_prefix: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    def created(self) -> list[dict[str, Any]]:
        """Bodies of every Job creation the Hub accepted, in order."""
        return list(self.created_bodies)

    def cancelled(self) -> list[str]:
        return [r.path.split("/")[4] for r in self.requests if r.method == "POST" and r.path.endswith("/cancel")]

    def add_job(self, labels: dict[str, str], stage: str = "RUNNING") -> FakeJob:
        with self.lock:
            job = self._new_job(NAMESPACE, {"labels": labels, "flavor": "h200", "dockerImage": "img", "command": []})
        job.stage = stage
        return job

    def _new_job(self, namespace: str, spec: dict[str, Any]) -> FakeJob:
        job_id = f"{len(self.jobs) + 1:024x}"
        job = FakeJob(
            id=job_id, namespace=namespace, spec=spec, created_at=f"2026-01-01T00:00:{len(self.jobs):02d}.000Z"
        )
        self.jobs[job_id] = job
        return job

    # --- the Hub API's state (hub_api.HubBackend)
    def record(self, request: Request) -> None:
        with self.lock:
            self.requests.append(request)

    def extra_route(self, handler: Any, request: Request, parts: list[str]) -> bool:
        """The Jobs proxy in front of an exposed port: /expose/<job_id>/<port>/health."""
        if parts[0] != "expose":
            return False
        job = self.jobs.get(parts[1])
        if job is None or job.stage != "RUNNING":
            handler.send_json(502, {"error": "job not running"})
        else:
            handler.send_json(200 if job.healthy else 503, {})
        return True

    def create_bucket(self, bucket_id: str) -> bool:
        with self.lock:
            existed = bucket_id in self.buckets
            self.buckets.setdefault(bucket_id, None)
        return not existed

    def bucket_exists(self, bucket_id: str) -> bool:
        return bucket_id in self.buckets

    def write_file(self, bucket_id: str, path: str, data: bytes) -> None:
        with self.lock:
            self.uploads.setdefault(bucket_id, {})[path] = data
            root = self.buckets.get(bucket_id)
        if root is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)

    def read_file(self, bucket_id: str, path: str) -> bytes | None:
        root = self.buckets.get(bucket_id)
        if root is not None and (root / path).is_file():
            return (root / path).read_bytes()
        return self.uploads.get(bucket_id, {}).get(path)

    def create_job(self, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            job = self._new_job(namespace, spec)
            self.created_bodies.append(spec)
        if self.on_create:
            self.on_create(job)
        return job.to_json()

    def list_jobs(self, labels: list[str], stages: list[str]) -> list[dict[str, Any]]:
        def matches(job: FakeJob) -> bool:
            have = job.spec.get("labels") or {}
            return all(have.get(w.split("=", 1)[0]) == w.split("=", 1)[1] for w in labels) and (
                not stages or job.stage in stages
            )

        return [job.to_json() for job in list(self.jobs.values()) if matches(job)]

    def job_json(self, job_id: str) -> dict[str, Any] | None:
        job = self.jobs.get(job_id)
        return job.to_json() if job else None

    def cancel_job(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if job.stage not in ("COMPLETED", "CANCELED", "ERROR", "DELETED"):
            job.stage = "CANCELED"

    def log_batches(self, job_id: str, tail: int | None):
        job = self.jobs[job_id]
        yield job.logs[-tail:] if tail else list(job.logs)
        if job.stage_after_logs:
            job.stage = job.stage_after_logs

    def hardware(self) -> list[dict[str, Any]] | None:
        return None if self.hardware_down else hardware_list(self.prices)

    def list_bucket(self, bucket_id: str, prefix: str) -> list[dict[str, Any]]:
        root = self.buckets.get(bucket_id)
        items = []
        if root is None or not root.exists():
            return items
        self.list_calls += 1
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(prefix):
                continue
            if self.hidden_polls.get(rel, 0) > 0:
                self.hidden_polls[rel] -= 1
                continue
            items.append(
                {
                    "type": "file",
                    "path": rel,
                    "size": path.stat().st_size,
                    "xetHash": "0" * 64,
                    "mtime": "2026-01-01T00:00:00.000Z",
                }
            )
        return items


def use_fake_hub(monkeypatch, hub: FakeHub) -> None:
    """Point huggingface_hub (HF_ENDPOINT, read at call time by agrpo) and the token at the fake Hub."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # tests set HF_HUB_OFFLINE=1
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    fake_bucket_uploads(monkeypatch)


fake_batch_bucket_files = plain_batch_bucket_files  # the child process's replacement (tests/fakes/child)
fake_download_bucket_files = plain_download_bucket_files


def fake_bucket_uploads(monkeypatch) -> None:
    """Bucket transfers over plain HTTP, as the stand-in Hub serves them (Xet cannot be faked)."""
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "batch_bucket_files", plain_batch_bucket_files)
    monkeypatch.setattr(HfApi, "download_bucket_files", plain_download_bucket_files)
