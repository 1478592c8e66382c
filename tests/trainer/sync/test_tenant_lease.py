"""The trainer as a tenant (agrpo/trainer/sync/tenant_lease.py): its tenancy from the launcher's environment, the lease
renewed from a daemon thread, the run ended with one paragraph when the fleet forgets it, and its share at the end.

The renewal goes over real HTTP to a server on loopback standing in for the fleet's tenant API (the real proxy's
answers are tested in tests/proxy/ and end to end in tests/e2e/test_shared_fleet.py); the signal that ends the run is
real and interrupts this test's main thread while it blocks.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agrpo.errors import ConfigError
from agrpo.trainer.sync.tenant_lease import (
    LEASE_ENV,
    TENANT_ENV,
    LeaseRenewer,
    Tenancy,
    TenantGone,
    ending_when_gone,
    fleet_call,
    fleet_share,
    interrupt_main,
    read_share,
    share_line,
    tenancy_from_env,
)

TOKEN_ENV = "AGRPO_PROXY_ADMIN_TOKEN"


def test_the_tenancy_comes_from_the_launchers_environment():
    env = {TENANT_ENV: "t2-smoke", LEASE_ENV: "8", TOKEN_ENV: "tok"}
    tenancy = tenancy_from_env(env, "http://127.0.0.1:9/")
    assert tenancy == Tenancy("t2-smoke", 8.0, "tok", "http://127.0.0.1:9")
    assert tenancy.renew_every_s == 2.0
    assert tenancy_from_env({TOKEN_ENV: "tok"}, "http://x") is None  # not on a shared fleet
    assert tenancy_from_env({TENANT_ENV: "t2-smoke", TOKEN_ENV: "t"}, "http://x").lease_s == 20.0  # the default


@pytest.mark.parametrize(
    "env, says",
    [
        ({TENANT_ENV: "../etc", TOKEN_ENV: "t"}, "not a tenant id"),
        ({TENANT_ENV: "t1-a", LEASE_ENV: "soon", TOKEN_ENV: "t"}, "not a lease"),
        ({TENANT_ENV: "t1-a", LEASE_ENV: "nan", TOKEN_ENV: "t"}, "not a lease"),
        ({TENANT_ENV: "t1-a", LEASE_ENV: "-3", TOKEN_ENV: "t"}, "not a lease"),
        ({TENANT_ENV: "t1-a"}, "the tenant's token"),
    ],
)
def test_a_bad_tenancy_is_one_config_error(env, says):
    with pytest.raises(ConfigError, match=says):
        tenancy_from_env(env, "http://x")


class Fleet(BaseHTTPRequestHandler):
    """The tenant API's lease and summary: `answers` is the list of statuses the lease gets, in turn (the last one
    repeats); every request is recorded with its Authorization header."""

    answers: list[int] = [200]
    requests: list[tuple[str, str, str | None]] = []
    entry: dict = {}
    stats: dict = {}

    def _answer(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self):  # http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Fleet.requests.append(("POST", self.path, self.headers.get("Authorization")))
        status = Fleet.answers.pop(0) if len(Fleet.answers) > 1 else Fleet.answers[0]
        self._answer(status, {"expires_in_s": 20.0} if status == 200 else {"message": f"said {status}"})

    def do_GET(self):
        Fleet.requests.append(("GET", self.path, self.headers.get("Authorization")))
        self._answer(200, Fleet.stats if self.path == "/proxy/stats" else Fleet.entry)

    def log_message(self, *args):
        pass


@pytest.fixture()
def fleet():
    Fleet.answers, Fleet.requests, Fleet.entry, Fleet.stats = [200], [], {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_renewal_carries_the_tenants_token_and_failures_are_logged_once(fleet, caplog):
    Fleet.answers = [200, 503, 503, 200, 404]
    gone = []
    renewer = LeaseRenewer(Tenancy("t1-a", 20.0, "secret", fleet), gone.append, fleet="shared")
    with caplog.at_level(logging.INFO, logger="agrpo.trainer.sync.tenant_lease"):
        results = [renewer.renew_once() for _ in range(5)]
    assert results == [True, True, True, True, False]
    assert Fleet.requests == [("POST", "/fleet/tenants/t1-a/lease", "Bearer secret")] * 5
    assert renewer.renewals == 2 and renewer.failures == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 503: said 503" in warnings[0] and "t1-a" in warnings[0]
    assert any("renewed again" in r.getMessage() for r in caplog.records)
    assert len(gone) == 1 and "the shared fleet shared no longer knows this run (tenant t1-a" in gone[0]


def test_an_unreachable_fleet_is_a_failed_renewal_not_the_end(caplog):
    renewer = LeaseRenewer(Tenancy("t1-a", 2.0, "s", "http://127.0.0.1:9"), lambda message: None)
    with caplog.at_level(logging.WARNING, logger="agrpo.trainer.sync.tenant_lease"):
        assert renewer.renew_once() is True and renewer.renew_once() is True
    assert renewer.failures == 2 and renewer.gone is None
    assert len(caplog.records) == 1 and "no answer" in caplog.records[0].getMessage()


def test_the_thread_renews_every_quarter_lease_and_a_404_interrupts_the_blocked_main_thread(fleet):
    Fleet.answers = [200, 200, 404]
    renewer = LeaseRenewer(Tenancy("t5-b", 0.4, "s", fleet), interrupt_main, fleet="f")
    blocked, waited_out = threading.Event(), []
    with pytest.raises(TenantGone) as raised:
        with ending_when_gone(renewer):
            waited_out.append(blocked.wait(30.0))  # the trainer, blocked (a wait for samples, say)
    assert waited_out == []  # interrupted inside the wait, not after it timed out
    assert len(Fleet.requests) == 3 and renewer.renewals == 2
    assert str(raised.value).startswith("the shared fleet f no longer knows this run (tenant t5-b: HTTP 404")
    assert "trainer.resume=auto" in str(raised.value)
    assert not renewer._thread.is_alive()


def test_a_run_that_ends_stops_renewing(fleet):
    renewer = LeaseRenewer(Tenancy("t5-b", 0.2, "s", fleet), interrupt_main)
    with ending_when_gone(renewer):
        time.sleep(0.3)
    count = len(Fleet.requests)
    time.sleep(0.3)
    assert count >= 1 and len(Fleet.requests) == count and not renewer._thread.is_alive()


def test_the_runs_share_is_read_from_the_fleet_at_the_end(fleet):
    Fleet.entry = {
        "tenant": "t1-a",
        "run": "a",
        "tokens": 12345,
        "replica_seconds": 30.0,
        "fleet": {"replica_seconds": 120.0, "replicas": 1, "idle_replica_seconds": 10.0},
    }
    section = read_share(Tenancy("t1-a", 20.0, "s", fleet), "shared")
    assert Fleet.requests == [("GET", "/fleet/tenants/t1-a", "Bearer s")]
    assert section == {
        "fleet": "shared",
        "tenant": "t1-a",
        "tokens": 12345,
        "replica_seconds_share": 30.0,
        "fleet_replica_seconds": 120.0,
        "share_of_fleet": 0.25,
    }
    assert share_line(section) == "fleet shared: this run's share 25% of 120 replica-seconds (12,345 tokens)"
    assert share_line(section, price_per_hour=3.6).endswith("(12,345 tokens), ~$0.03")


def test_with_the_totals_merged_over_the_entry_the_runs_own_seconds_come_from_the_proxys_stats(fleet):
    """The proxy's answer `{**entry, **totals}`: the top `replica_seconds` is the fleet's; the run's own is its row of
    /proxy/stats (open, counters only)."""
    Fleet.entry = {"tenant": "t1-a", "tokens": 800, "replica_seconds": 90.0, "replicas": 1, "idle_replica_seconds": 9}
    Fleet.stats = {
        "tenants": [{"tenant": "t2-b", "replica_seconds": 50.0}, {"tenant": "t1-a", "replica_seconds": 30.0}]
    }
    section = read_share(Tenancy("t1-a", 20.0, "s", fleet), "f")
    assert [path for _, path, _ in Fleet.requests] == ["/fleet/tenants/t1-a", "/proxy/stats"]
    assert section["replica_seconds_share"] == 30.0 and section["fleet_replica_seconds"] == 90.0
    assert section["share_of_fleet"] == pytest.approx(1 / 3) and section["tokens"] == 800
    assert share_line(section) == "fleet f: this run's share 33% of 90 replica-seconds (800 tokens)"


def test_a_share_without_figures_is_none_and_a_fleet_gone_at_the_end_is_logged(caplog):
    assert fleet_share("f", {"tenant": "t1-a"}) is None
    assert fleet_share("f", {"tokens": 5, "replica_seconds": float("nan")})["share_of_fleet"] is None
    with caplog.at_level(logging.WARNING, logger="agrpo.trainer.sync.tenant_lease"):
        assert read_share(Tenancy("t1-a", 20.0, "s", "http://127.0.0.1:9"), "f", timeout_s=2.0) is None
    assert "no shared_fleet section" in caplog.records[0].getMessage()


def test_fleet_call_reads_error_bodies(fleet):
    Fleet.answers = [409]
    status, body = fleet_call(Tenancy("t1-a", 20.0, "s", fleet), "POST", "/fleet/tenants/t1-a/lease", 5.0)
    assert (status, body) == (409, {"message": "said 409"})
