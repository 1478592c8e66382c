"""The trainer's tenant side against the real proxy with `--tenancy` (agrpo/proxy/, in a thread): renewals every
lease/4 keep a run registered past its lease, the run's share is read from the proxy's own answers, and a run whose
lease lapsed is told so by a 404 and ends with one paragraph. Only the replica behind the proxy is a stand-in (a
loopback HTTP server that answers /health): no completion is generated here; tests/e2e/test_shared_fleet.py runs the
whole thing with vLLM.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agrpo.trainer.sync.tenant_lease import (
    LeaseRenewer,
    Tenancy,
    TenantGone,
    ending_when_gone,
    interrupt_main,
    read_share,
)

ADMIN = "fleet-admin-secret-for-tenant-tests-0123"
ADMIN_ENV = "AGRPO_TEST_TENANT_ADMIN"


class Replica(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server's naming
        raw = json.dumps({"data": []} if self.path.startswith("/v1/models") else {"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture()
def proxy(monkeypatch):
    from agrpo.proxy import ProxySettings
    from agrpo.proxy.thread import start_proxy_thread

    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    replica = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    settings = ProxySettings(
        upstreams=[f"http://127.0.0.1:{replica.server_port}"],
        port=0,
        tenancy=True,
        admin_token_env=ADMIN_ENV,
        health_interval_s=0.2,
    )
    with start_proxy_thread(settings) as running:
        yield running.url
    replica.shutdown()


def register(url: str, run: str, lease_s: float) -> Tenancy:
    body = json.dumps({"run": run, "lease_s": lease_s, "versions": 2, "lora_rank": 8}).encode()
    request = urllib.request.Request(
        f"{url}/fleet/tenants",
        method="POST",
        data=body,
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    return Tenancy(answer["tenant"], float(answer["lease_s"]), answer["token"], url)


def test_renewals_keep_the_run_registered_past_its_lease_and_its_share_is_read(proxy):
    tenancy = register(proxy, "lease-kept", lease_s=2.0)
    renewer = LeaseRenewer(tenancy, lambda message: None, fleet="t").start()
    try:
        time.sleep(4.5)  # more than twice the lease
        section = read_share(tenancy, "t")
    finally:
        renewer.stop()
    assert renewer.renewals >= 4 and renewer.failures == 0 and renewer.gone is None
    assert section is not None and section["tenant"] == tenancy.tenant and section["fleet"] == "t"
    assert section["tokens"] == 0 and section["replica_seconds_share"] == 0.0  # nothing generated for it
    assert section["fleet_replica_seconds"] is not None and section["fleet_replica_seconds"] > 0


def test_a_lapsed_lease_ends_the_run_with_one_paragraph(proxy):
    tenancy = register(proxy, "lease-lapsed", lease_s=1.0)
    time.sleep(3.0)  # the proxy checks leases every second: this one is gone
    renewer = LeaseRenewer(tenancy, interrupt_main, fleet="t")
    with pytest.raises(TenantGone) as raised:
        with ending_when_gone(renewer):
            threading.Event().wait(30.0)  # the trainer, blocked; interrupted at the first renewal (0.25 s)
    message = str(raised.value)
    assert message.startswith(f"the shared fleet t no longer knows this run (tenant {tenancy.tenant}: HTTP 404")
    assert "\n" not in message and renewer.renewals == 0
