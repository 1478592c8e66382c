"""The fleet's ledger of its tenants (agrpo/launchers/fleet_ledger.py), pure: a run that left is kept with its last
figures, shares are of the replica-seconds the proxy attributed, and the console gets at most three lines."""

from __future__ import annotations

from agrpo.launchers.fleet_ledger import TenantLedger, summary_lines


def entry(tenant, seconds, tokens):
    return {"tenant": tenant, "run": "smoke", "tokens": tokens, "requests": 10, "replica_seconds": seconds}


def test_a_tenant_that_left_keeps_its_last_figures_and_shares_add_up():
    ledger = TenantLedger("http://127.0.0.1:9", "token")
    ledger.take({"tenants": [entry("t1-a", 10.0, 100), entry("t2-b", 5.0, 50)], "replica_seconds": 20.0})
    ledger.take({"tenants": [entry("t2-b", 30.0, 300)], "replica_seconds": 50.0, "idle_replica_seconds": 10.0})
    summary = ledger.summary("demo", 80.0, 100.0, 130.0, 180.0, "SIGTERM")
    assert [(t["tenant"], t["replica_seconds"], t["share"], t["left_before_the_end"]) for t in summary["tenants"]] == [
        ("t2-b", 30.0, 0.6, False),
        ("t1-a", 10.0, 0.2, True),
    ]
    assert (summary["replica_seconds"], summary["attributed_replica_seconds"], summary["up_s"]) == (80.0, 50.0, 80.0)
    lines = summary_lines(summary)
    assert lines == [
        "fleet demo stopped (SIGTERM) after 80 s: 80 replica-seconds (50 in rotation, 10 idle)",
        "fleet demo: tenants' shares: t2-b 60%, t1-a 20% (by tokens generated); 1 run(s) still attached lost their "
        "fleet",
    ]


def test_a_proxy_that_never_answered_says_so():
    ledger = TenantLedger("http://127.0.0.1:9", "token")
    ledger.poll(force=True)
    summary = ledger.summary("demo", 10.0, 0.0, 5.0, 10.0, "SIGINT")
    assert summary["attributed_replica_seconds"] is None and summary["tenants"] == []
    assert summary_lines(summary)[1].startswith("fleet demo: tenants' shares unknown: its proxy does not answer")
