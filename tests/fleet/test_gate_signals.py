"""Fair-share waits as a fleet signal (issue 43's leftovers, item 3): the time a shared fleet's tenants' requests wait at
the proxy's fair-share gate counts as their starvation (agrpo/fleet/signals.py `starvation`), so an auto fleet grows
on it and does not release while it lasts. Pure figures, then the proxy's clock of those waits, the reader that puts
them on each tenant's steps (agrpo/fleet/files.py TenantSteps) and the ledger it reads them from."""

from __future__ import annotations

import pytest

from agrpo.fleet import files
from agrpo.fleet.policy import ADD, HOLD, RELEASE, Knobs, Memory, decide
from agrpo.fleet.signals import GATE_WAIT_S, TENANT, gate_deltas, run_signals, starvation, window_signals
from agrpo.fleet.signals import with_gate_waits
from agrpo.launchers.fleet_ledger import TenantLedger
from agrpo.proxy.tenants import Tenant
from agrpo.processes.private_dir import RUNTIME_ENV

STEP, WAIT = "perf/step_s", "perf/rollout_wait_s"


def steps(tenant: str, count: int, step_s: float, wait_s: float, gate_s: float = 0.0) -> list[dict]:
    return [{STEP: step_s, WAIT: wait_s, GATE_WAIT_S: gate_s, TENANT: tenant} for _ in range(count)]


@pytest.mark.parametrize(
    "wait_s, gate_s, step_s, share",
    [
        (1.0, 3.0, 10.0, 0.3),  # the trainer hardly waited, its requests queued at the gate 30% of the time
        (5.0, 2.0, 10.0, 0.5),  # the gate's wait inside the trainer's own: the larger, not the sum
        (2.0, 0.0, 10.0, 0.2),  # no gate (a run on its own fleet): the trainer's wait as before
        (1.0, 30.0, 10.0, 1.0),  # capped at the whole step
        (1.0, 1.0, 0.0, None),  # no timed step: unknown
    ],
)
def test_starvation_is_the_larger_of_the_trainers_wait_and_the_gates(wait_s, gate_s, step_s, share):
    assert starvation(wait_s, gate_s, step_s) == share


def test_a_tenant_whose_requests_wait_at_the_gate_is_starved_though_its_trainer_is_not():
    quiet = run_signals(steps("t1-a", 6, 1.0, 0.0), now=10.0, replicas=1)
    gated = run_signals(steps("t1-a", 6, 1.0, 0.0, gate_s=0.4), now=10.0, replicas=1)
    assert (quiet.wait_share, gated.wait_share) == (0.0, pytest.approx(0.4))
    assert gated.steps_per_s == quiet.steps_per_s == 1.0  # only the starvation moves


@pytest.mark.parametrize(
    "gates, replicas, action",
    [
        ((0.4, 0.0), 1, ADD),  # trainers at 0% wait, one tenant's requests queued 40% of its steps: grow
        ((0.01, 0.0), 2, RELEASE),  # hardly any queueing: the fleet may shrink, as before
        ((0.1, 0.0), 2, HOLD),  # queued 10%: no release while the gate holds requests back
    ],
)
def test_the_auto_fleet_grows_on_gate_waits_and_holds_its_replicas_while_they_last(gates, replicas, action):
    entries = [e for k, gate in enumerate(gates) for e in steps(f"t{k + 1}-run", 6, 1.0, 0.0, gate)]
    signals = window_signals(entries, now=100.0, replicas=replicas)
    decision, _ = decide(signals, Memory(), Knobs(min_replicas=1, max_replicas=2))
    assert decision.action == action
    if action == ADD:
        assert "waited 40% of each step" in decision.reason


def test_gate_deltas_count_what_each_tenant_waited_since_the_last_reading():
    seen: dict[str, float] = {}
    assert gate_deltas({"t1-a": 2.0, "t2-b": 0.0}, seen) == {"t1-a": 2.0, "t2-b": 0.0}
    assert gate_deltas({"t1-a": 5.5, "t2-b": 1.0}, seen) == {"t1-a": 3.5, "t2-b": 1.0}
    assert gate_deltas({"t1-a": 0.5}, seen) == {"t1-a": 0.5}  # a total that went back (a new proxy): from zero
    assert seen == {"t1-a": 0.5}  # t2-b left: forgotten


def test_the_wait_owed_goes_on_each_tenants_newest_step_or_waits_for_its_next_one():
    owed = {"t1-a": 1.5, "t2-b": 0.75}
    entries = [{STEP: 1.0, TENANT: "t1-a"}, {STEP: 1.0, TENANT: "t1-a"}, {STEP: 2.0}]
    out = with_gate_waits(entries, owed)
    assert [e.get(GATE_WAIT_S) for e in out] == [None, 1.5, None]
    assert owed == {"t2-b": 0.75} and GATE_WAIT_S not in entries[1]  # no step of t2-b yet: still owed; input kept


def test_the_proxy_counts_time_with_a_request_waiting_once_however_many_wait():
    tenant = Tenant("t1-a", "a", b"", 20.0, 3, 8, 0.0, 20.0)
    tenant.gate_enter(10.0)
    tenant.gate_enter(11.0)  # a second request waits meanwhile
    assert tenant.gate_wait_s(12.0) == 2.0  # the time, not 2 + 1
    tenant.gate_leave(12.5)
    tenant.gate_leave(13.0)
    tenant.gate_enter(20.0)
    tenant.gate_leave(20.5)
    assert tenant.gate_wait_s(30.0) == 3.5
    assert tenant.entry([], 30.0)["gate_wait_s"] == 3.5  # what GET /fleet/tenants says


def test_the_fleets_reader_puts_the_ledgers_gate_waits_on_each_tenants_steps(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    ledger = TenantLedger("http://127.0.0.1:9", "x")
    reader = files.TenantSteps("demo", gate=ledger.gate_waits)
    runs = {tenant: tmp_path / tenant for tenant in ("t1-a", "t2-b")}
    for tenant, run_dir in runs.items():
        files.write_tenant("demo", tenant, run_dir)
    reader.read()
    ledger.take({"tenants": [{"tenant": "t1-a", "gate_wait_s": 1.0}, {"tenant": "t2-b", "gate_wait_s": 0.0}]})
    files.append_step(runs["t1-a"], {STEP: 2.0, WAIT: 0.0})
    assert [e.get(GATE_WAIT_S) for e in reader.read()] == [1.0]
    ledger.take({"tenants": [{"tenant": "t1-a", "gate_wait_s": 1.8}, {"tenant": "t2-b", "gate_wait_s": 0.5}]})
    assert reader.read() == []  # no new step: the 0.8 s and 0.5 s are owed
    files.append_step(runs["t1-a"], {STEP: 2.0, WAIT: 0.0})
    files.append_step(runs["t2-b"], {STEP: 1.0, WAIT: 0.0})
    by_tenant = {e[TENANT]: e[GATE_WAIT_S] for e in reader.read()}
    assert by_tenant == {"t1-a": pytest.approx(0.8), "t2-b": 0.5}
    ledger.take({"tenants": [{"tenant": "t2-b", "gate_wait_s": 0.5}]})  # t1-a left the fleet
    assert "t1-a" not in ledger.gate_waits()
