"""`agrpo fleet status` and `agrpo fleet down` on real records and real processes (agrpo/launchers/fleet_cli.py,
agrpo/fleet/status.py). The fleet's proxy is a stand-in HTTP server answering `GET /fleet/tenants` as the contract
says (docs/shared_fleet.md): these tests are about the CLI, not the proxy; the fleet itself is a real process that
stops on SIGTERM as `agrpo fleet up` does. The real fleet runs in tests/e2e/test_shared_fleet.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agrpo.fleet.registry import list_fleets, write_fleet
from agrpo.launchers.fleet_cli import main
from agrpo.processes.private_dir import RUNTIME_ENV
from agrpo.processes.watchdog import start_time
from tests.fleet.test_registry import a_record, gone_pid

TOKEN = "a" * 43
ANSWER = {
    "tenants": [
        {
            "tenant": "t1-smoke",
            "run": "smoke",
            "adapters": ["t1-smoke/trl-policy-v3", "t1-smoke/trl-policy-v4"],
            "in_flight": 8,
            "requests": 120,
            "tokens": 12345,
            "replica_seconds": 30.0,
            "registered_at": 0.0,
            "lease_expires_in_s": 17.2,
        }
    ],
    "replica_seconds": 40.0,
    "replicas": 1,
    "idle_replica_seconds": 10.0,
}


@pytest.fixture
def runtime(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    return tmp_path / "rt"


@pytest.fixture
def proxy():
    """A stand-in for the fleet's proxy: GET /fleet/tenants with the admin token only."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/fleet/tenants" and self.headers.get("Authorization") == f"Bearer {TOKEN}"
            body = json.dumps(ANSWER if ok else {"message": "no"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def a_fleet_process(own_group: bool) -> subprocess.Popen:
    """A process that stops on SIGTERM as the fleet does (its own process group, or its parent's)."""
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=own_group)
    time.sleep(0.3)  # its handler is installed
    return process


def test_status_with_no_fleet_says_how_to_start_one(runtime, capsys):
    assert main(["status"]) == 0
    assert capsys.readouterr().out == "no fleet is running (start one with `agrpo fleet up [NAME] +recipe=NAME`)\n"


def test_status_lists_a_fleet_its_tenants_and_shares_and_removes_stale_records(runtime, proxy, capsys):
    write_fleet(a_record("demo", url=proxy, admin_token=TOKEN))
    write_fleet(a_record("gone", pid=gone_pid(), pid_start=None))
    assert main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fleet gone: not running (its process " + lines[0].split("process ")[1]
    assert lines[0].endswith("is gone); removed its stale record")
    assert lines[1].startswith(f"fleet demo: {proxy}, pid {os.getpid()}, up 0m ")
    assert "model /models/tiny-qwen2 (max_model_len 256, LoRA rank <= 8), 1/4 tenants" in lines[1]
    assert lines[2] == "  1 replica(s), 40 replica-seconds (10 idle)"
    assert lines[3] == (
        "  t1-smoke (run smoke): 2 adapter(s) [t1-smoke/trl-policy-v3, t1-smoke/trl-policy-v4], 8 in flight, "
        "120 requests, 12,345 tokens, 30 replica-s (75%), lease 17 s"
    )
    assert [fleet.name for fleet in list_fleets()[0]] == ["demo"] and list_fleets()[1] == []
    assert TOKEN not in "\n".join(lines)


def test_status_of_a_fleet_whose_proxy_does_not_answer(runtime, capsys):
    write_fleet(a_record("demo", url="http://127.0.0.1:9"))  # the discard port: nothing listens
    assert main(["status", "demo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fleet demo: http://127.0.0.1:9") and "?/4 tenants" in out[0]
    assert out[1].startswith("  its proxy does not answer")


def test_status_of_an_unknown_fleet_is_exit_2(runtime, capsys):
    assert main(["status", "nope"]) == 2
    assert "no fleet named 'nope' is running" in capsys.readouterr().err


@pytest.mark.parametrize("own_group", [True, False])
def test_down_stops_the_fleet_and_its_record_goes(runtime, capsys, own_group):
    """A fleet leading its own group gets SIGTERM by group; one started as a plain child (its parent's group, this
    test's) by pid alone: this test's own group is never signalled."""
    process = a_fleet_process(own_group)
    try:
        write_fleet(a_record("demo", pid=process.pid, pgid=os.getpgid(process.pid), pid_start=start_time(process.pid)))
        assert main(["down", "demo"]) == 0
        assert capsys.readouterr().out.startswith("fleet demo stopped (")
        assert process.wait(timeout=5) == 0  # it exited through its SIGTERM handler
        assert list_fleets() == ([], [], {})
    finally:
        process.kill()


def test_down_of_a_stale_or_garbage_record_removes_it(runtime, capsys):
    write_fleet(a_record("demo", pid=gone_pid(), pid_start=None))
    assert main(["down", "demo"]) == 0
    assert "was not running" in capsys.readouterr().out and list_fleets() == ([], [], {})
    (runtime / "fleets" / "bad.json").write_text("{")
    assert main(["down", "bad"]) == 1
    assert "cannot be read: not JSON" in capsys.readouterr().out and list_fleets() == ([], [], {})


def test_usage_errors_are_exit_2(runtime, capsys):
    assert main(["sideways"]) == 2 and "unknown command 'sideways'" in capsys.readouterr().err
    assert main(["status", "a", "b"]) == 2 and "one fleet name at most" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "agrpo fleet up [NAME] +recipe=R" in capsys.readouterr().out


def test_the_agrpo_command_runs_fleet_status(tmp_path):
    env = {**os.environ, RUNTIME_ENV: str(tmp_path / "rt")}
    done = subprocess.run(
        [sys.executable, "-m", "agrpo", "fleet", "status"], env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout.split(" (")[0]) == (0, "no fleet is running")
