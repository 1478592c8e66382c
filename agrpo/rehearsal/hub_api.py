"""The one stand-in of the Hugging Face Hub API (I/O): the routes huggingface_hub's HfApi calls for Jobs and Buckets.

It serves both the rehearsal (standin.py: Jobs as local process groups) and the tests' fake Hub
(tests/fakes/fake_hub.py: Jobs as scripted records); each supplies a `HubBackend` that holds the state, and the
routes, the token check and the refusals are the same for both, so neither is kinder than the other:
- every route needs `Authorization: Bearer <the backend's token>` (401 otherwise), as the Hub does for private Jobs
  and buckets;
- Jobs and buckets outside the backend's namespace are refused (403);
- a Job creation body the Jobs API would refuse (hub_rules.py: unknown flavor, bad labels, a bucket that does not
  exist, ...) gets 400 with the reason.

Routes: whoami-v2; buckets (create, tree listing); jobs (hardware, create, list by label and stage, inspect, cancel,
logs as server-sent events); and, because Xet (the Hub's file transfer) cannot be stood in for over plain HTTP,
`PUT|GET /stand-in/files/<namespace>/<bucket>/<path>`, which plain_transfer.py uses in place of HfApi's
batch_bucket_files and download_bucket_files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator
from urllib.parse import parse_qsl, unquote, urlsplit

from agrpo.rehearsal.hub_rules import job_spec_problems

FILES_ROUTE = "stand-in/files"  # plain-HTTP bucket file transfer, in place of Xet


@dataclass
class Request:
    """One request as the backend's `record` sees it (the fake Hub keeps them for tests to assert on)."""

    method: str
    path: str
    query: list[tuple[str, str]]
    body: Any
    headers: dict[str, str]


class HubBackend:
    """The state behind the routes. Subclasses implement every method; ids are `namespace/name` for buckets."""

    namespace = ""
    token = ""

    def record(self, request: Request) -> None:
        """Called for every request, before its answer."""

    def extra_route(self, handler: Any, request: Request, parts: list[str]) -> bool:
        """A route of the subclass's own, after the token check (True: answered)."""
        return False

    def create_bucket(self, bucket_id: str) -> bool:  # True: created now; False: it existed (the Hub's 409)
        raise NotImplementedError

    def bucket_exists(self, bucket_id: str) -> bool:
        raise NotImplementedError

    def list_bucket(self, bucket_id: str, prefix: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def write_file(self, bucket_id: str, path: str, data: bytes) -> None:
        raise NotImplementedError

    def read_file(self, bucket_id: str, path: str) -> bytes | None:
        raise NotImplementedError

    def create_job(self, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def list_jobs(self, labels: list[str], stages: list[str]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def job_json(self, job_id: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def cancel_job(self, job_id: str) -> None:
        raise NotImplementedError

    def log_batches(self, job_id: str, tail: int | None) -> Iterator[list[str]]:
        """The Job's log lines in batches; the stream ends when this generator does."""
        raise NotImplementedError

    def hardware(self) -> list[dict[str, Any]] | None:
        """The hardware list (hub_rules.hardware_list); None answers 404, as an unreachable price list."""
        raise NotImplementedError


class HubHandler(BaseHTTPRequestHandler):
    """The routes; `backend` is set on the subclass `hub_handler` makes for each server."""

    backend: HubBackend
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # the requests are recorded; the Jobs' own logs are what matters
        pass

    def send_json(self, status: int, payload: Any = None, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps({} if payload is None else payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _request(self) -> tuple[Request, bytes]:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = None
        if raw and self.command == "POST":
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        return Request(self.command, parts.path, parse_qsl(parts.query), body, dict(self.headers)), raw

    def do_GET(self):
        self._route(*self._request())

    def do_POST(self):
        self._route(*self._request())

    def do_PUT(self):
        self._route(*self._request())

    def _route(self, r: Request, raw: bytes) -> None:
        self.backend.record(r)
        parts = [unquote(p) for p in r.path.strip("/").split("/")]
        if self.headers.get("Authorization") != f"Bearer {self.backend.token}":
            return self.send_json(401, {"error": "Invalid credentials in Authorization header"})
        if self.backend.extra_route(self, r, parts):
            return None
        if parts[:2] == ["api", "whoami-v2"]:
            return self.send_json(200, {"name": self.backend.namespace, "type": "user", "auth": {}})
        if "/".join(parts[:2]) == FILES_ROUTE and len(parts) >= 5:
            return self._files(r.method, f"{parts[2]}/{parts[3]}", "/".join(parts[4:]), raw)
        if parts[:2] == ["api", "buckets"] and len(parts) >= 4:
            return self._buckets(r.method, f"{parts[2]}/{parts[3]}", parts[4:])
        if parts[:3] == ["api", "jobs", "hardware"]:
            listed = self.backend.hardware()
            return self.send_json(200, listed) if listed is not None else self.send_json(404, {"error": "no"})
        if parts[:2] == ["api", "jobs"] and len(parts) >= 3:
            return self._jobs(r, parts[2], parts[3:])
        self.send_json(404, {"error": f"the stand-in Hub has no route {r.method} {r.path}"})

    def _owned(self, bucket_id: str) -> bool:
        if bucket_id.split("/", 1)[0] == self.backend.namespace:
            return True
        self.send_json(403, {"error": f"no access to bucket {bucket_id}"})
        return False

    def _files(self, method: str, bucket_id: str, path: str, raw: bytes) -> None:
        if not self._owned(bucket_id):
            return
        if not self.backend.bucket_exists(bucket_id):
            return self.send_json(404, {"error": f"bucket {bucket_id} not found"})
        if ".." in path.split("/"):
            return self.send_json(400, {"error": f"bad path {path}"})
        if method == "PUT":
            self.backend.write_file(bucket_id, path, raw)
            return self.send_json(200, {})
        data = self.backend.read_file(bucket_id, path)
        if data is None:
            return self.send_json(404, {"error": f"{path} not found in bucket {bucket_id}"})
        self.send_json(200, data, content_type="application/octet-stream")

    def _buckets(self, method: str, bucket_id: str, rest: list[str]) -> None:
        if not self._owned(bucket_id):
            return
        if method == "POST" and not rest:  # huggingface_hub reads "url" from the 409 answer too
            created = self.backend.create_bucket(bucket_id)
            url = f"http://{self.headers.get('Host')}/buckets/{bucket_id}"
            return self.send_json(200 if created else 409, {"url": url, "id": bucket_id})
        if rest[:1] == ["tree"]:
            if not self.backend.bucket_exists(bucket_id):
                return self.send_json(404, {"error": f"bucket {bucket_id} not found"})
            return self.send_json(200, self.backend.list_bucket(bucket_id, "/".join(rest[1:])))
        self.send_json(404, {"error": "not found"})

    def _jobs(self, r: Request, namespace: str, rest: list[str]) -> None:
        if namespace != self.backend.namespace:
            return self.send_json(403, {"error": f"no access to namespace {namespace}"})
        if not rest and r.method == "POST":
            problems = job_spec_problems(r.body, self.backend.bucket_exists)
            if problems:
                return self.send_json(400, {"error": "; ".join(problems)})
            return self.send_json(200, self.backend.create_job(namespace, r.body))
        if not rest:
            labels = [v for k, v in r.query if k == "label"]
            stages = [v for k, v in r.query if k == "stage"]
            return self.send_json(200, self.backend.list_jobs(labels, stages))
        found = self.backend.job_json(rest[0])
        if found is None:
            return self.send_json(404, {"error": f"Job {rest[0]} not found"})
        if rest[1:] == ["cancel"] and r.method == "POST":
            self.backend.cancel_job(rest[0])
            return self.send_json(200, {})
        if rest[1:] == ["logs"]:
            tail = dict(r.query).get("tail")
            return self._logs(rest[0], int(tail) if tail else None)
        if not rest[1:]:
            return self.send_json(200, found)
        self.send_json(404, {"error": "not found"})

    def _logs(self, job_id: str, tail: int | None) -> None:
        """Server-sent events, one per line, until the backend's stream ends (the Job is over)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for lines in self.backend.log_batches(job_id, tail):
                for line in lines:
                    event = json.dumps({"data": line, "timestamp": "2026-01-01T00:00:00.000Z"})
                    self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return


def hub_handler(backend: HubBackend) -> type[BaseHTTPRequestHandler]:
    """The request handler class of a server whose state is `backend`."""
    return type("Handler", (HubHandler,), {"backend": backend})
