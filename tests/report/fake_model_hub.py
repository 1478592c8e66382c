"""A fake Hugging Face Hub for model repos on 127.0.0.1: what `agrpo push` calls through huggingface_hub's HfApi.

The real Hub cannot be reached from these machines. This server answers the four routes HfApi.create_repo and
HfApi.create_commit use (huggingface_hub 2.x): POST /api/repos/create, /api/validate-yaml,
/api/models/{repo}/preupload/{revision} and /api/models/{repo}/commit/{revision} (NDJSON). Every file is
answered "regular" at preupload, so its bytes travel base64 in the commit body and the test can read them back; the
real Hub answers "lfs" for weights and takes them through its LFS/Xet storage, which this fake does not model.
It records each request and keeps each repo's files, checks the bearer token, and refuses unknown repos with 404.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NAMESPACE = "alice"
FAKE_TOKEN = "hf_FAKE_model_hub_token_456"


@dataclass
class Request:
    method: str
    path: str
    body: Any
    headers: dict[str, str]


@dataclass
class FakeRepo:
    visibility: str | None
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)


class FakeModelHub:
    def __init__(self):
        self.requests: list[Request] = []
        self.repos: dict[str, FakeRepo] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeModelHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, path_part: str) -> list[Request]:
        return [r for r in self.requests if path_part in r.path]


def _handler(hub: FakeModelHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "ndjson" in (self.headers.get("Content-Type") or ""):
                body: Any = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
            else:
                body = json.loads(raw) if raw else None
            path = self.path.split("?", 1)[0]
            with hub.lock:
                hub.requests.append(Request("POST", path, body, {k.lower(): v for k, v in self.headers.items()}))
            if self.headers.get("Authorization") != f"Bearer {FAKE_TOKEN}":
                return self._send(401, {"error": "Invalid credentials in Authorization header"})
            parts = path.strip("/").split("/")
            if parts == ["api", "repos", "create"]:
                return self._create(body)
            if parts == ["api", "validate-yaml"]:
                return self._send(200, {"errors": [], "warnings": []})
            if len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] in ("preupload", "commit"):
                repo = hub.repos.get(f"{parts[2]}/{parts[3]}")
                if repo is None:
                    return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                return self._preupload(body) if parts[4] == "preupload" else self._commit(repo, body, parts)
            self._send(404, {"error": f"no route {path}"})

        def _create(self, body: dict[str, Any]) -> None:
            repo_id = f"{body.get('organization') or NAMESPACE}/{body['name']}"
            url = {"url": f"{hub.url}/{repo_id}"}
            with hub.lock:
                if repo_id in hub.repos:
                    return self._send(409, {"error": "You already created this model repo", **url})
                hub.repos[repo_id] = FakeRepo(visibility=body.get("visibility"))
            self._send(200, url)

        def _preupload(self, body: dict[str, Any]) -> None:
            files = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in body["files"]
            ]
            self._send(200, {"files": files})

        def _commit(self, repo: FakeRepo, lines: list[dict[str, Any]], parts: list[str]) -> None:
            header = next(line["value"] for line in lines if line["key"] == "header")
            with hub.lock:
                for line in lines:
                    if line["key"] == "file":
                        repo.files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                repo.commits.append(header)
            oid = f"{len(repo.commits):040x}"
            self._send(200, {"commitUrl": f"{hub.url}/{parts[2]}/{parts[3]}/commit/{oid}", "commitOid": oid})

    return Handler


def use_fake_model_hub(monkeypatch, hub: FakeModelHub, token: str | None = FAKE_TOKEN) -> None:
    """Point huggingface_hub at the fake (HF_ENDPOINT, read by agrpo at call time) with the fake token (or none)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # tests set HF_HUB_OFFLINE=1
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    if token is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
