"""A real HTTP server on loopback standing in for vLLM's `/v1/completions` (and `/v1/models`) behind agrpo's proxy,
for the rollout loop's tests without a model: what it answers is the test's `answer(request) -> (status, body)`;
every request is recorded (model, Authorization header, prompt ids)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def completion(ids: list[int], replica: str | None = None) -> tuple[int, dict, dict]:
    """vLLM's answer with `return_token_ids` and `logprobs=0`: the sampled ids and one logprob each."""
    body = {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}, "text": ""}]}
    return 200, body, ({"X-Agrpo-Replica": replica} if replica else {})


@dataclass
class StandIn:
    answer: Callable[[dict], tuple[int, dict, dict]]
    max_model_len: int | None = None
    seen: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def models(self) -> list[str]:
        with self.lock:
            return [r["model"] for r in self.seen]


@contextmanager
def stand_in_vllm(
    answer: Callable[[dict], tuple[int, dict, dict]], max_model_len: int | None = None
) -> Iterator[tuple[str, StandIn]]:
    """(its URL, the StandIn recording what it got); shut down on exit."""
    state = StandIn(answer, max_model_len)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's naming
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            request["authorization"] = self.headers.get("Authorization")
            with state.lock:
                state.seen.append(request)
            self._send(*state.answer(request))

        def do_GET(self):
            models = [{"id": "base", "max_model_len": state.max_model_len}] if state.max_model_len else [{"id": "base"}]
            self._send(200, {"data": models}, {})

        def _send(self, status: int, body: Any, headers: dict) -> None:
            raw = json.dumps(body).encode()
            try:
                self._write(status, raw, headers)
            except (BrokenPipeError, ConnectionResetError):  # the client stopped waiting (a test's stop): fine
                pass

        def _write(self, status: int, raw: bytes, headers: dict) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", state
    finally:
        server.shutdown()
        server.server_close()
