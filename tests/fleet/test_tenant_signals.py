"""A shared fleet sized on its tenants' signals (issue 43): each attached run's launcher leaves a record of its run dir
(agrpo/fleet/files.py), the controller reads every tenant's steps, tagged, and the policy sees one window combined
from them (agrpo/fleet/signals.py: the most starved tenant's wait, the tenants' summed steps/s). The real files and
the real policy; HTTP (the fleet's proxy, the replicas' /metrics) and the spare replica are stand-ins, said where."""

from __future__ import annotations

import os
import random
import stat

import pytest

from agrpo.fleet import files
from agrpo.fleet.policy import ADD, HOLD, RELEASE, Knobs, Memory, decide
from agrpo.fleet.signals import TENANT, combine_tenants, latest, run_signals, window_signals
from agrpo.interprocess import Skipped
from agrpo.launchers import fleet_up
from agrpo.launchers.fleet_up import fleet_spec, without_trainer
from agrpo.launchers.shared_fleet import attached_tenant
from agrpo.processes.private_dir import RUNTIME_ENV, runtime_dir
from tests.fleet.test_controller import Proxy, Spare
from tests.launchers.test_shared_fleet_plan import ADMIN, FakeFleet, attached, builder
from tests.fleet.test_registry import a_record
from tests.plans import bound_example
from tests.specs import spec_for

STEP, WAIT = "perf/step_s", "perf/rollout_wait_s"


def tagged(tenant: str, count: int, step_s: float, wait_s: float) -> list[dict]:
    return [{STEP: step_s, WAIT: wait_s, TENANT: tenant} for _ in range(count)]


@pytest.fixture
def runtime(monkeypatch, tmp_path):
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    return tmp_path


# ---------------------------------------------------------------------------- the combination (pure)
@pytest.mark.parametrize(
    "tenants, wait, steps, steps_per_s",
    [
        # (tenant: (steps, step_s, wait_s)); the wait is the most starved tenant's, its steps the window's
        ({"a": (6, 2.0, 1.5), "b": (8, 0.5, 0.0)}, 0.75, 6, 0.5 + 2.0),
        ({"a": (6, 1.0, 0.0), "b": (3, 1.0, 0.01)}, 0.01, 3, 2.0),  # every tenant compute-bound: the max is small
        ({"a": (2, 1.0, 0.5), "b": (7, 1.0, 0.5)}, 0.5, 7, 2.0),  # a tie goes to the better measured tenant
        ({"a": (5, 4.0, 4.0)}, 1.0, 5, 0.25),  # one tenant: its own figures
    ],
)
def test_the_most_starved_tenant_leads_and_steps_per_s_add_up(tenants, wait, steps, steps_per_s):
    entries = [e for name, (n, step_s, wait_s) in tenants.items() for e in tagged(name, n, step_s, wait_s)]
    random.Random(0).shuffle(entries)  # interleaved as the tenants step
    signals = window_signals(entries, now=5.0, replicas=2, busy=0.25)
    assert (signals.wait_share, signals.steps, signals.steps_per_s) == pytest.approx((wait, steps, steps_per_s))
    assert (signals.now, signals.replicas, signals.busy_share) == (5.0, 2, 0.25)


def test_a_tenant_without_a_timed_step_is_left_out():
    signals = window_signals([{TENANT: "a", "batch/samples_per_step": 4.0}], now=1.0, replicas=1)
    assert signals.steps == 0 and signals.wait_share is None and signals.steps_per_s is None
    mixed = window_signals([{TENANT: "a"}, *tagged("b", 3, 1.0, 0.2)], now=1.0, replicas=1)
    assert (mixed.steps, mixed.wait_share) == (3, pytest.approx(0.2))


def test_property_the_combined_wait_is_the_max_and_one_run_is_unchanged():
    """200 seeded random windows: the combined wait share is the max of the tenants' own, steps/s their sum, and an
    untagged window (a run's own fleet) gives exactly what one run's signals are."""
    rng = random.Random(43)
    for _ in range(200):
        per = {f"t{k}-run": [rng.uniform(0.1, 5.0) for _ in range(rng.randint(1, 9))] for k in range(rng.randint(1, 4))}
        entries = [{STEP: s, WAIT: s * rng.random(), TENANT: t} for t, times in per.items() for s in times]
        rng.shuffle(entries)
        own = {t: run_signals([e for e in entries if e[TENANT] == t], 0.0, 1) for t in per}
        combined = window_signals(entries, 0.0, 1)
        assert combined.wait_share == max(s.wait_share for s in own.values())
        assert combined.steps_per_s == pytest.approx(sum(s.steps_per_s for s in own.values()))
        plain = [{k: v for k, v in e.items() if k != TENANT} for e in entries]
        assert window_signals(plain, 0.0, 1) == run_signals(plain, 0.0, 1)
        count = rng.randint(0, 12)
        assert latest(plain, count) == plain[-count:]


def test_latest_keeps_each_tenants_last_steps_of_those_still_attached():
    entries = tagged("a", 5, 1.0, 0.0) + tagged("b", 2, 2.0, 0.0)
    for index, entry in enumerate(entries):
        entry["step"] = index
    assert [e["step"] for e in latest(entries, 3)] == [2, 3, 4, 5, 6]  # b's 2 steps are not pushed out by a's
    assert [e["step"] for e in latest(entries, 3, tenants={"b"})] == [5, 6]  # a left
    assert latest(entries, 3, tenants=set()) == []


@pytest.mark.parametrize(
    "waits, action",
    [
        ((0.6, 0.0), ADD),  # one tenant starves: grow
        ((0.01, 0.0), RELEASE),  # all compute-bound: release
        ((0.03, 0.0), HOLD),  # one between the release and the add shares: balanced
    ],
)
def test_the_policy_grows_when_any_tenant_starves_and_releases_only_when_all_are_compute_bound(waits, action):
    entries = [e for k, w in enumerate(waits) for e in tagged(f"t{k}-run", 6, 1.0, w)]
    signals = window_signals(entries, now=100.0, replicas=2 if action == RELEASE else 1)
    knobs = Knobs(min_replicas=1, max_replicas=2)
    assert decide(signals, Memory(), knobs)[0].action == action
    if action == HOLD:
        assert decide(signals, Memory(), knobs)[0].reason == "balanced"


def test_combine_with_no_tenant_is_an_empty_window():
    signals = combine_tenants({}, now=3.0, replicas=1)
    assert (signals.steps, signals.wait_share, signals.steps_per_s) == (0, None, None)


# ---------------------------------------------------------------------------- the tenant records and their steps
def test_tenant_records_are_private_read_back_and_removed(runtime):
    files.write_tenant("demo", "t1-smoke", runtime / "r1")
    files.write_tenant("demo", "t2-other", runtime / "r2")
    where = runtime_dir("fleets", "demo", "tenants")
    assert stat.S_IMODE(os.stat(where / "t1-smoke.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    assert files.read_tenants("demo") == {"t1-smoke": str(runtime / "r1"), "t2-other": str(runtime / "r2")}
    files.remove_tenant("demo", "t1-smoke")
    files.remove_tenant("demo", "t1-smoke")  # twice: nothing to remove, no error
    assert files.read_tenants("demo") == {"t2-other": str(runtime / "r2")}
    files.clear_tenants("demo")
    assert files.read_tenants("demo") == {} and files.read_tenants("other") == {}
    with pytest.raises(ValueError, match="not a tenant id"):
        files.write_tenant("demo", "../escape", runtime)


def test_a_bad_tenant_record_is_skipped_and_counted(runtime):
    files.write_tenant("demo", "t1-smoke", runtime / "r1")
    where = runtime_dir("fleets", "demo", "tenants")
    (where / "t2-bad.json").write_text("{not json")
    (where / "t3-liar.json").write_text('{"tenant": "t1-smoke", "run_dir": "/elsewhere"}')
    os.symlink(where / "t1-smoke.json", where / "t4-link.json")
    skipped = Skipped()
    assert files.read_tenants("demo", skipped) == {"t1-smoke": str(runtime / "r1")}
    assert skipped.counts == {"tenants": 3}


def test_tenant_steps_tags_each_line_and_forgets_a_run_that_left(runtime):
    r1, r2 = runtime / "r1", runtime / "r2"
    files.append_step(r1, {STEP: 9.0, WAIT: 9.0})  # before it attached: an earlier attempt's, not counted
    reader = files.TenantSteps("demo")
    assert reader.read() == [] and reader.tenants == set()
    files.write_tenant("demo", "t1-smoke", r1)
    files.write_tenant("demo", "t2-other", r2)
    assert reader.read() == [] and reader.tenants == {"t1-smoke", "t2-other"}
    files.append_step(r1, {STEP: 1.0, WAIT: 0.5})
    files.append_step(r2, {STEP: 2.0, WAIT: 0.0})
    (r2 / "fleet" / "steps.jsonl").open("a").write('{"perf/step_s": NaN}\n')
    assert reader.read() == [{STEP: 1.0, WAIT: 0.5, TENANT: "t1-smoke"}, {STEP: 2.0, WAIT: 0.0, TENANT: "t2-other"}]
    assert reader.skipped.total == 1
    files.remove_tenant("demo", "t1-smoke")
    files.append_step(r1, {STEP: 1.0, WAIT: 0.5})
    assert reader.read() == [] and reader.tenants == {"t2-other"}


def test_an_attached_run_leaves_its_record_while_registered(runtime):
    """The real registration path against a stand-in fleet proxy (tests/launchers/test_shared_fleet_plan.py)."""
    fake = FakeFleet()
    try:
        from agrpo.fleet.registry import write_fleet

        write_fleet(a_record("demo", url=fake.url, admin_token=ADMIN))
        _, plan = attached(url=fake.url)
        with pytest.raises(RuntimeError, match="the trainer failed"):
            with attached_tenant(plan):
                assert files.read_tenants("demo") == {"t1-smoke": str(os.path.realpath(plan.run_dir))}
                raise RuntimeError("the trainer failed")
        assert files.read_tenants("demo") == {}  # removed whatever the outcome
    finally:
        fake.close()


# ---------------------------------------------------------------------------- fleet up's wiring
def test_fleet_up_sizes_an_auto_fleet_on_its_tenants_steps(runtime, monkeypatch, capsys):
    """`agrpo fleet up`'s serve() with inference.replicas=auto: its controller reads the tenants' records and steps.
    Stand-ins: the services (no vLLM or proxy process starts: start_services returns placeholders), the controller's
    HTTP (tests/fleet/test_controller.py's Proxy answers /proxy/stats, /metrics and the admin routes) and its spare."""
    overrides = ("inference.replicas=auto", "inference.max_replicas=2", "inference.fleet.standby=false")
    cfg = fleet_spec(spec_for("+recipe=smoke", *overrides, output_dir=str(runtime / "fleet")))
    plan = bound_example(without_trainer(builder(cfg, str(runtime / "fleet"))))
    (runtime / "fleet").mkdir()
    files.write_tenant("demo", "t9-killed", runtime / "gone")  # a killed run's leftover: cleared at fleet up
    files.clear_tenants("demo")  # what up() does before serve()
    seen = {}

    class Service:
        exit_code = None

        def alive(self):
            return True

    def drive(proxy, supervisor, controller, ledger):
        stand_in = Proxy()
        controller.get, controller.send, controller.admin_token = stand_in.get, stand_in.send, "admin"
        spare = Spare("vllm-1", 8101)
        controller.spares = [spare]
        files.write_tenant("demo", "t1-fast", runtime / "r1")
        files.write_tenant("demo", "t2-starved", runtime / "r2")
        controller.poll()  # the tenants are seen; their steps start from here
        for _ in range(6):
            files.append_step(runtime / "r1", {STEP: 0.5, WAIT: 0.0})
            files.append_step(runtime / "r2", {STEP: 2.0, WAIT: 1.4})
        controller.last_poll = float("-inf")
        controller.poll()
        seen.update(spare=spare.running, tenants=controller.reader.tenants, replicas=controller.replicas)
        raise KeyboardInterrupt

    monkeypatch.setattr(fleet_up, "start_services", lambda plan, timeout, started: [Service() for _ in plan.services])
    monkeypatch.setattr(fleet_up, "keep_up", drive)
    monkeypatch.setattr(fleet_up, "finish", lambda *args: None)
    stopped = []
    monkeypatch.setattr(fleet_up, "stop_all", lambda processes, timeout_s: stopped.extend(processes))
    assert fleet_up.serve(plan, cfg, "demo") == 0
    assert seen == {"spare": True, "tenants": {"t1-fast", "t2-starved"}, "replicas": 1}
    assert [p.name for p in stopped] == ["vllm-1"]  # the added spare is in what the fleet stops at its end
    out = capsys.readouterr().out
    assert (
        "agrpo fleet: 1 -> 2 replicas (vllm-1 starting): generation-bound: the trainer waited 70% of each step" in out
    )
    assert "at 2.50 steps/s" in out  # 2 + 0.5: the fleet's throughput, both tenants'
