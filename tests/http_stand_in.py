"""A real HTTP server on loopback that stands in for vLLM or the fleet's proxy: it answers every POST with 200 and
`{}`, and hands what it got to the test's own recorder first."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer


@contextmanager
def post_stand_in(record: Callable[[str, object, bytes], None]) -> Iterator[str]:
    """Yields the URL of a server that calls record(path, headers, raw body) on each POST, then answers 200 `{}`;
    shut down on exit."""

    class StandIn(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server's naming
            record(self.path, self.headers, self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
