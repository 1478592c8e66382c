"""The stand-in's two listeners on 127.0.0.1 (I/O): the Hub API (hub_api.py, the same routes and refusals as the
tests' fake Hub, over the StandIn's state), and the gateway that stands for the Jobs proxy in front of exposed ports.

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
from http.server import ThreadingHTTPServer

from agrpo.rehearsal import jobs as J
from agrpo.rehearsal.hub_api import hub_handler
from agrpo.rehearsal.standin import StandIn

LOAD_ADAPTER = "/v1/load_lora_adapter"  # the one request whose file lookup the gateway models (negative cache)


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
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), hub_handler(stand_in))
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
