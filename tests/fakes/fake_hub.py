"""A fake Hugging Face Hub on 127.0.0.1 for the HF Jobs launcher and bucket-sync tests.

The real Hub cannot be reached from these machines, so this server answers the routes huggingface_hub's HfApi
calls (whoami, buckets: create + tree listing, jobs: create/list/inspect/cancel/logs) plus the Jobs proxy's exposed
ports (`/expose/<job_id>/<port>/health`, standing in for https://<job_id>--<port>.hf.jobs). It records every
request, so tests assert the exact bodies the launcher sent.

Scenario knobs per Job (set in `on_create`, a callback that sees the created Job): `stage`, `message`, `healthy`,
`logs` (lines served by /logs) and `stage_after_logs` (the stage a Job moves to once its logs were streamed).
A bucket is backed by a local folder (the "mount"); `hidden_polls` hides a file from the listing for its first N
listings, like the Hub's listing lagging behind an upload.

Uploads: huggingface_hub sends bucket files through Xet's native client, which cannot be faked over plain HTTP, so
`fake_bucket_uploads` replaces `HfApi.batch_bucket_files` with a PUT of each file's bytes to this server
(`/fake-upload/<ns>/<bucket>/<path>`), which records them in `uploads` and writes them into the bucket's folder.
A child process gets the same replacement from tests/fakes/child/sitecustomize.py (FAKE_HUB_UPLOADS=1).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote, urlsplit

NAMESPACE = "alice"
FAKE_TOKEN = "hf_FAKE_secret_token_value_123"  # a value no test output may ever contain


@dataclass
class Request:
    method: str
    path: str
    query: list[tuple[str, str]]
    body: Any
    headers: dict[str, str]


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
        }


def trainer_completes(*lines: str) -> Callable[[FakeJob], None]:
    """An `on_create` under which the trainer Job streams `lines` and then COMPLETES (replicas keep running)."""

    def on_create(job: FakeJob) -> None:
        if job.spec["labels"]["agrpo-role"] == "trainer":
            job.logs, job.stage_after_logs = list(lines), "COMPLETED"

    return on_create


class FakeHub:
    def __init__(self, on_create: Callable[[FakeJob], None] | None = None):
        self.requests: list[Request] = []
        self.jobs: dict[str, FakeJob] = {}
        self.buckets: dict[str, Path | None] = {}
        self.hidden_polls: dict[str, int] = {}  # bucket path -> listings still to hide it from
        self.list_calls = 0
        self.uploads: dict[str, dict[str, bytes]] = {}  # bucket id -> path in bucket -> bytes
        self.on_create = on_create
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
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
        """Bodies of every job creation, in order."""
        return [r.body for r in self.calls("POST", f"/api/jobs/{NAMESPACE}") if r.path == f"/api/jobs/{NAMESPACE}"]

    def cancelled(self) -> list[str]:
        return [r.path.split("/")[4] for r in self.requests if r.method == "POST" and r.path.endswith("/cancel")]

    def add_job(self, labels: dict[str, str], stage: str = "RUNNING") -> FakeJob:
        with self.lock:
            job = self._new_job(NAMESPACE, {"labels": labels, "flavor": "h200", "dockerImage": "img", "command": []})
        job.stage = stage
        return job

    # --- server side
    def _new_job(self, namespace: str, spec: dict[str, Any]) -> FakeJob:
        job_id = f"{len(self.jobs) + 1:024x}"
        job = FakeJob(
            id=job_id, namespace=namespace, spec=spec, created_at=f"2026-01-01T00:00:{len(self.jobs):02d}.000Z"
        )
        self.jobs[job_id] = job
        return job

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


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, payload: Any = None, content_type: str = "application/json") -> None:
            data = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self) -> Request:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            request = Request(self.command, parts.path, parse_qsl(parts.query), body, dict(self.headers))
            with hub.lock:
                hub.requests.append(request)
            return request

        def do_GET(self):
            self._route(self._record())

        def do_POST(self):
            self._route(self._record())

        def do_PUT(self):  # fake uploads: the raw bytes of one file
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            bucket_id, dest = f"{parts[1]}/{parts[2]}", "/".join(parts[3:])
            with hub.lock:
                hub.uploads.setdefault(bucket_id, {})[dest] = data
                hub.requests.append(Request("PUT", urlsplit(self.path).path, [], None, dict(self.headers)))
                root = hub.buckets.get(bucket_id)
            if root is not None:
                (root / dest).parent.mkdir(parents=True, exist_ok=True)
                (root / dest).write_bytes(data)
            self._send(200, {})

        def _route(self, r: Request) -> None:
            parts = [unquote(p) for p in r.path.strip("/").split("/")]
            if parts[:2] == ["api", "whoami-v2"]:
                return self._send(200, {"name": NAMESPACE, "type": "user"})
            if parts[0] == "expose":  # the Jobs proxy in front of an exposed port
                job = hub.jobs.get(parts[1])
                if r.headers.get("Authorization") != f"Bearer {FAKE_TOKEN}":
                    return self._send(401, {"error": "token required"})
                if job is None or job.stage != "RUNNING":
                    return self._send(502, {"error": "job not running"})
                return self._send(200 if job.healthy else 503, {})
            if parts[:2] == ["api", "buckets"]:
                bucket_id = f"{parts[2]}/{parts[3]}"
                if r.method == "POST":  # huggingface_hub reads "url" from the 409 answer too
                    status = 409 if bucket_id in hub.buckets else 200
                    hub.buckets.setdefault(bucket_id, None)
                    return self._send(status, {"url": f"{hub.url}/buckets/{bucket_id}"})
                if len(parts) >= 5 and parts[4] == "tree":
                    return self._send(200, hub.list_bucket(bucket_id, "/".join(parts[5:])))
                return self._send(404, {"error": "not found"})
            if parts[:2] == ["api", "jobs"]:
                return self._jobs(r, parts[2], parts[3:])
            self._send(404, {"error": f"no route {r.path}"})

        def _jobs(self, r: Request, namespace: str, rest: list[str]) -> None:
            if namespace != NAMESPACE:
                return self._send(403, {"error": f"no access to {namespace}"})
            if not rest and r.method == "POST":
                with hub.lock:
                    job = hub._new_job(namespace, r.body)
                if hub.on_create:
                    hub.on_create(job)
                return self._send(200, job.to_json())
            if not rest:
                wanted = [v for k, v in r.query if k == "label"]
                found = [
                    j.to_json()
                    for j in hub.jobs.values()
                    if all((j.spec.get("labels") or {}).get(w.split("=", 1)[0]) == w.split("=", 1)[1] for w in wanted)
                ]
                return self._send(200, found)
            job = hub.jobs.get(rest[0])
            if job is None:
                return self._send(404, {"error": "no such job"})
            if rest[1:] == ["cancel"]:
                if job.stage not in ("COMPLETED", "CANCELED", "ERROR", "DELETED"):
                    job.stage = "CANCELED"
                return self._send(200, {})
            if rest[1:] == ["logs"]:
                events = "".join(
                    "data: " + json.dumps({"data": line, "timestamp": "2026-01-01T00:00:00Z"}) + "\n\n"
                    for line in job.logs
                )
                if job.stage_after_logs:
                    job.stage = job.stage_after_logs
                return self._send(200, events.encode(), content_type="text/event-stream")
            return self._send(200, job.to_json())

    return Handler


def use_fake_hub(monkeypatch, hub: FakeHub) -> None:
    """Point huggingface_hub (HF_ENDPOINT, read at call time by agrpo) and the token at the fake Hub."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # tests set HF_HUB_OFFLINE=1
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    fake_bucket_uploads(monkeypatch)


def fake_batch_bucket_files(self, bucket_id: str, *, add=None, copy=None, delete=None, token=None) -> None:
    """Stands in for HfApi.batch_bucket_files (Xet cannot be faked): PUT each added file to the fake Hub."""
    import requests

    if copy or delete:
        raise NotImplementedError("the fake Hub only records added files")
    for source, dest in add or []:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        response = requests.put(f"{self.endpoint}/fake-upload/{bucket_id}/{dest}", data=data, timeout=30)
        response.raise_for_status()


def fake_bucket_uploads(monkeypatch) -> None:
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "batch_bucket_files", fake_batch_bucket_files)
