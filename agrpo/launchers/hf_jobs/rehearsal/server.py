"""The stand-in's two listeners on 127.0.0.1 (I/O): the Hub API routes huggingface_hub calls, and the gateway that
stands for the Jobs proxy in front of exposed ports.

API: whoami-v2; jobs (create, list by label, inspect, cancel, logs as server-sent events that follow a running Job);
buckets (create, tree listing with the modelled lag); plus `PUT /rehearsal-upload/<bucket>/<path>`, which the
launcher's upload uses instead of Xet (Xet's native client cannot be stood in for; see rehearse.py).
Gateway: a request for `<job_id>--<port>.hf.jobs` (by Host, or `/expose/<job_id>/<port>/...` by path) needs the
bearer token, as the real proxy does for a private Job, and is forwarded to that Job's network namespace. A
`load_lora_adapter` whose adapter the Job's bucket mount cannot show yet (listing lag, negative-lookup cache:
bucket.py) gets vLLM's 404 "No adapter found" instead, as a real replica whose mount cached the miss answers.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from agrpo.launchers.hf_jobs.rehearsal import jobs as J
from agrpo.launchers.hf_jobs.rehearsal.standin import StandIn

UPLOAD_ROUTE = "rehearsal-upload"
LOAD_ADAPTER = "/v1/load_lora_adapter"  # the one request whose file lookup the gateway models (negative cache)


def api_handler(stand_in: StandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # the Jobs' own logs are what matters
            pass

        def _send(self, status: int, payload: Any = None) -> None:
            data = json.dumps(payload if payload is not None else {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {stand_in.token}":
                return True
            self._send(401, {"error": "Invalid credentials in Authorization header"})
            return False

        def do_GET(self):
            self._route("GET", b"")

        def do_POST(self):
            self._route("POST", self._body())

        def do_PUT(self):
            self._route("PUT", self._body())

        def _route(self, method: str, raw: bytes) -> None:
            parts_url = urlsplit(self.path)
            parts = [unquote(p) for p in parts_url.path.strip("/").split("/")]
            query = parse_qsl(parts_url.query)
            if not self._authorized():
                return
            if parts[:2] == ["api", "whoami-v2"]:
                return self._send(200, {"name": stand_in.namespace, "type": "user", "auth": {}})
            if parts[0] == UPLOAD_ROUTE and method == "PUT":
                stand_in.write_upload(f"{parts[1]}/{parts[2]}", "/".join(parts[3:]), raw)
                return self._send(200, {})
            if parts[:2] == ["api", "buckets"] and len(parts) >= 4:
                return self._buckets(method, f"{parts[2]}/{parts[3]}", parts[4:])
            if parts[:2] == ["api", "jobs"] and len(parts) >= 3:
                return self._jobs(method, parts[2], parts[3:], query, raw)
            self._send(404, {"error": f"the rehearsal stand-in has no route {method} {parts_url.path}"})

        def _buckets(self, method: str, bucket_id: str, rest: list[str]) -> None:
            if method == "POST" and not rest:
                created = stand_in.create_bucket(bucket_id)
                return self._send(
                    200 if created else 409, {"url": f"{stand_in.api_url}/buckets/{bucket_id}", "id": bucket_id}
                )
            if rest[:1] == ["tree"]:
                if not stand_in.bucket_dir(bucket_id).exists():
                    return self._send(404, {"error": f"bucket {bucket_id} not found"})
                return self._send(200, stand_in.list_bucket(bucket_id, "/".join(rest[1:])))
            self._send(404, {"error": "not found"})

        def _jobs(self, method: str, namespace: str, rest: list[str], query, raw: bytes) -> None:
            if namespace != stand_in.namespace:
                return self._send(403, {"error": f"no access to namespace {namespace}"})
            if not rest and method == "POST":
                job = stand_in.create_job(namespace, json.loads(raw))
                return self._send(200, job.to_json(stand_in.gateway))
            if not rest:
                labels = [v for k, v in query if k == "label"]
                stages = [v for k, v in query if k == "stage"]
                with stand_in.lock:
                    found = [
                        j.to_json(stand_in.gateway)
                        for j in stand_in.jobs.values()
                        if J.matches_labels(j, labels) and (not stages or j.stage in stages)
                    ]
                return self._send(200, found)
            job = stand_in.jobs.get(rest[0])
            if job is None:
                return self._send(404, {"error": f"Job {rest[0]} not found"})
            if rest[1:] == ["cancel"] and method == "POST":
                stand_in.cancel(job.id)
                return self._send(200, {})
            if rest[1:] == ["logs"]:
                return self._logs(job, dict(query).get("tail"))
            if not rest[1:]:
                with stand_in.lock:
                    return self._send(200, job.to_json(stand_in.gateway))
            self._send(404, {"error": "not found"})

        def _logs(self, job: J.JobRecord, tail: str | None) -> None:
            """Every line so far, then new lines while the Job runs; the stream ends when the Job is over."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            path, offset, first = stand_in.log_path(job.id), 0, True
            try:
                while True:
                    over = job.stage in J.TERMINAL and job.id not in stand_in.procs
                    text = b""
                    if path.exists():
                        with open(path, "rb") as log:  # only what was added since the last poll
                            log.seek(offset)
                            text = log.read()
                    complete = text[: text.rfind(b"\n") + 1] if not over else text
                    offset += len(complete)
                    lines = complete.decode(errors="replace").splitlines()
                    if first and tail:
                        lines = lines[-int(tail) :]
                    first = False
                    stamp = J.iso(time.time())
                    for line in lines:
                        event = json.dumps({"data": line, "timestamp": stamp})
                        self.wfile.write(f"data: {event}\n\n".encode())
                    self.wfile.flush()
                    if over:
                        return
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


def gateway_handler(stand_in: StandIn):
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            client.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            head, _, rest = head.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = (lines[0].split(" ") + ["", "", ""])[:3]
            headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
            found = {k.strip().lower(): v.strip() for k, v in headers}
            routed = J.route(found.get("host"), target)
            if routed is None:
                return self._reply(client, 404, "no exposed port at this address")
            job_id, port, path = routed
            if found.get("authorization") != f"Bearer {stand_in.token}":
                return self._reply(client, 401, "the Jobs proxy requires an HF token")
            job, address = stand_in.jobs.get(job_id), stand_in.job_url_ip(job_id)
            if job is None or job.stage != "RUNNING" or address is None or port not in job.exposed_ports:
                return self._reply(client, 502, f"Job {job_id} is not running or does not expose {port}")
            if method == "POST" and path.split("?", 1)[0] == LOAD_ADAPTER:
                rest = _read_body(client, rest, int(found.get("content-length") or 0))
                missing = _unseen_adapter(stand_in, job_id, rest)
                if missing:
                    return self._reply(client, 404, missing, vllm_style=True)
            try:
                upstream = socket.create_connection((address, port), timeout=10)
            except OSError as error:
                return self._reply(client, 502, f"Job {job_id} port {port}: {error}")
            kept = [f"{k}:{v}" for k, v in headers if k.strip().lower() != "connection"]
            new_head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"]) + "\r\n\r\n"
            upstream.sendall(new_head.encode("latin-1") + rest)
            upstream.settimeout(None)
            client.settimeout(None)
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            _pipe(upstream, client)

        @staticmethod
        def _reply(client: socket.socket, status: int, why: str, vllm_style: bool = False) -> None:
            payload = {"object": "error", "message": why, "type": "NotFoundError", "param": None, "code": status}
            body = json.dumps(payload if vllm_style else {"error": why}).encode()
            client.sendall(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )

    return Handler


def _read_body(client: socket.socket, start: bytes, length: int) -> bytes:
    body = start
    while len(body) < length:
        chunk = client.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


def _unseen_adapter(stand_in: StandIn, job_id: str, body: bytes) -> str | None:
    """vLLM's answer for an adapter its disk does not show, when the Job's modelled mount does not show it yet."""
    try:
        lora_path = str(json.loads(body or b"{}").get("lora_path") or "")
    except (ValueError, AttributeError):
        return None
    if not lora_path or stand_in.mount_lookup(job_id, lora_path.rstrip("/") + "/adapter_config.json"):
        return None
    return f"Loading lora failed: No adapter found for {lora_path} (rehearsal: the bucket mount does not show it yet)"


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


class Listeners:
    """Both listeners, on free ports of 127.0.0.1, each served by a daemon thread."""

    def __init__(self, stand_in: StandIn):
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), api_handler(stand_in))
        self.gateway = socketserver.ThreadingTCPServer(("127.0.0.1", 0), gateway_handler(stand_in))
        self.gateway.daemon_threads = True
        self.api.daemon_threads = True
        stand_in.api_url = f"http://127.0.0.1:{self.api.server_address[1]}"
        stand_in.gateway = f"127.0.0.1:{self.gateway.server_address[1]}"
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self.api, self.gateway)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        for server in (self.api, self.gateway):
            server.shutdown()
            server.server_close()
