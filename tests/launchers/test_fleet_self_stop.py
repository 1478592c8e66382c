"""A sweep's fleet stops itself once the sweep's points all registered and left (agrpo/launchers/fleet_up.py
STOP_AFTER_ENV, set by agrpo/sweep_fleet.py), instead of idling until the sweep's end reaches its callback. The loop
is the fleet's own `keep_up`, its ledger fed the proxy's answers as GET /fleet/tenants gives them."""

from __future__ import annotations

import pytest

from agrpo.launchers import fleet_up
from agrpo.launchers.fleet_ledger import TenantLedger
from agrpo.launchers.fleet_up import STOP_AFTER_ENV, Done, every_run_left, keep_up, runs_expected


class Proxy:
    def alive(self) -> bool:
        return True


class Answers(TenantLedger):
    """The ledger, its proxy's answers given in turn (one a poll)."""

    def __init__(self, answers):
        super().__init__("http://127.0.0.1:9", "x")
        self.answers = list(answers)
        self.polls = 0

    def poll(self, force: bool = False, now: float | None = None) -> None:
        self.polls += 1
        if self.answers:
            self.take(self.answers.pop(0))


def tenants(*ids: str) -> dict:
    return {"tenants": [{"tenant": t} for t in ids]}


def test_every_run_left_needs_the_count_registered_and_none_attached():
    ledger = TenantLedger("http://127.0.0.1:9", "x")
    assert not every_run_left(ledger, 2)  # nobody came yet
    ledger.take(tenants("t1-a", "t2-b"))
    assert not every_run_left(ledger, 2)
    ledger.take(tenants("t2-b"))
    assert not every_run_left(ledger, 2)  # one still attached
    ledger.take(tenants())
    assert every_run_left(ledger, 2) and not every_run_left(ledger, 3) and not every_run_left(ledger, 0)


def test_the_fleet_stops_itself_once_its_sweeps_runs_left(monkeypatch):
    monkeypatch.setenv(STOP_AFTER_ENV, "3")
    monkeypatch.setattr(fleet_up.time, "sleep", lambda s: None)
    # 2 points at a time (a fleet of 2 tenants): a moment with nobody attached between them is not the end
    ledger = Answers([tenants("t1-a", "t2-b"), tenants("t2-b"), tenants(), tenants("t3-c"), tenants(), tenants()])
    with pytest.raises(Done) as done:
        keep_up(Proxy(), None, None, ledger, poll_s=0)
    assert ledger.polls == 5 and done.value.signame == "its sweep's 3 run(s) all left"


def test_without_the_count_it_runs_until_a_signal(monkeypatch):
    monkeypatch.delenv(STOP_AFTER_ENV, raising=False)
    assert runs_expected() == 0
    monkeypatch.setenv(STOP_AFTER_ENV, "x")
    assert runs_expected() == 0

    def stop_after(seconds):
        if ledger.polls >= 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(fleet_up.time, "sleep", stop_after)
    ledger = Answers([tenants("t1-a"), tenants()])
    with pytest.raises(KeyboardInterrupt) as stopped:
        keep_up(Proxy(), None, None, ledger, poll_s=0)
    assert not isinstance(stopped.value, Done) and ledger.polls == 4
