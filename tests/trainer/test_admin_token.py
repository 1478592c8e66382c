"""The trainer's side of the proxy's admin token: TRL's VLLMClient sends it on every call once the launcher gave it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from agrpo.trainer.seam.module_patches import _BearerRequests


class Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # http.server's naming
        length = int(self.headers.get("Content-Length", 0))
        Recorder.seen.append((self.path, self.headers.get("Authorization"), self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_every_call_carries_the_bearer_and_keeps_its_own_arguments():
    server = HTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stand_in = _BearerRequests("s3cret")
        url = f"http://127.0.0.1:{server.server_port}"
        stand_in.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "trl-policy-v1"}, timeout=5)
        stand_in.post(f"{url}/pause", params={"mode": "keep"}, headers={"X-Other": "1"}, timeout=5)
    finally:
        server.shutdown()
    (path1, auth1, body1), (path2, auth2, _) = Recorder.seen
    assert (path1, auth1, json.loads(body1)) == (
        "/v1/load_lora_adapter",
        "Bearer s3cret",
        {"lora_name": "trl-policy-v1"},
    )
    assert (path2, auth2) == ("/pause?mode=keep", "Bearer s3cret")
    import requests

    assert stand_in.ConnectionError is requests.ConnectionError  # TRL's except clauses still match
