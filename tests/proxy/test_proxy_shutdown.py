"""`python -m agrpo.proxy` stopped by SIGTERM (the launcher's teardown) or SIGINT (Ctrl-C) with requests in flight:
it exits 0 and its stderr (proxy.log under a launcher) holds no traceback, no CancelledError and no `Unclosed client
session`.

Before: a client that left while the proxy waited for its request during shutdown made that request's task cancelled,
and front.py awaited it directly: the CancelledError (a BaseException) escaped `ProxyServer.stop`, which then never
closed its client session (a traceback, `Unclosed client session` and `Unclosed connector`, exit 1).

The proxy is a real subprocess; its replica is a fake (`FakeReplica`, in a thread of the test) that takes every
completion and never answers, as a replica in the middle of a long generation does."""

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from proxy_fakes import FakeReplica

REPO = Path(__file__).resolve().parents[2]
IN_FLIGHT = 3  # lean-front requests held by the replica when the signal comes
WAIT_S = 30.0  # bounds a hang; never a measurement


class ReplicaThread:
    """A FakeReplica on its own event loop in a thread, answering /health and holding every completion."""

    def __init__(self):
        self.replica = FakeReplica("held", hang_paths={"/v1/completions", "/v1/chat/completions"})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeReplica:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.replica.start(), self.loop).result(WAIT_S)
        return self.replica

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.replica.stop(), self.loop).result(WAIT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)


def wait_until(predicate, what: str):
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def completion_request(port: int, chunked: bool = False) -> bytes:
    body = json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    if chunked:  # not the lean front's: handed over to aiohttp's server, which serves it to the end
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def start_proxy(upstream: str, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / "proxy.out", tmp_path / "proxy.err"
    argv = [sys.executable, "-m", "agrpo.proxy", "--upstream", upstream, "--port", "0"]
    argv += ["--shutdown-timeout-s", "1", "--health-interval-s", "60"]
    with open(out, "wb") as stdout, open(err, "wb") as stderr:  # files: nothing waits on a full pipe
        process = subprocess.Popen(argv, cwd=REPO, stdout=stdout, stderr=stderr)
    wait_until(lambda: "listening on" in out.read_text() or process.poll() is not None, "the proxy to listen")
    assert process.poll() is None, err.read_text()
    return process, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("clients_leave", [True, False], ids=["clients-leave", "clients-stay"])
def test_a_signal_with_requests_in_flight_stops_the_proxy_without_a_traceback(tmp_path, sig, clients_leave):
    with ReplicaThread() as replica:
        process, out, err = start_proxy(replica.url, tmp_path)
        port = int(out.read_text().split("listening on http://127.0.0.1:", 1)[1].split()[0])
        clients = []
        try:
            for index in range(IN_FLIGHT + 1):
                client = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
                client.sendall(completion_request(port, chunked=index == IN_FLIGHT))
                clients.append(client)
            wait_until(lambda: len(replica.requests("/v1/completions")) == IN_FLIGHT + 1, "the replica to hold them")
            process.send_signal(sig)
            if clients_leave:  # while the proxy waits for their requests (--shutdown-timeout-s)
                time.sleep(0.2)
                for client in clients:
                    client.close()
            code = process.wait(WAIT_S)
        finally:
            for client in clients:
                client.close()
            if process.poll() is None:
                process.kill()
                process.wait()
    stderr = err.read_text()
    assert code == 0, stderr
    for word in ("Traceback", "CancelledError", "Unclosed", "Task was destroyed", "never retrieved"):
        assert word not in stderr, stderr
    assert "proxy on http://127.0.0.1:" in stderr  # the log did reach the file: the absence above means something


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_an_idle_proxy_without_replicas_answering(tmp_path, sig):
    """No replica up at all (the launcher's teardown after the replicas went first)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{unused.getsockname()[1]}"
    process, _out, err = start_proxy(nobody, tmp_path)
    process.send_signal(sig)
    code = process.wait(WAIT_S)
    stderr = err.read_text()
    assert code == 0, stderr
    assert "marked unhealthy" in stderr and "Traceback" not in stderr and "Unclosed" not in stderr, stderr
