"""The fleet controller's steps with stand-ins for the processes and the HTTP (the real ones run in
tests/e2e/test_elastic.py): it adds on generation-bound steps, hands the newcomer to the proxy only once healthy,
judges the change on the steps after it, drains before it stops a replica, and counts replica-seconds."""

from __future__ import annotations

import json

from agrpo.fleet import files
from agrpo.fleet.controller import FleetController
from agrpo.fleet.policy import Knobs


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Spare:
    def __init__(self, name: str, port: int):
        self.name, self.health_url, self.log_path = name, f"http://127.0.0.1:{port}/health", "vllm.log"
        self.running = False

    def start(self):
        self.running = True

    def alive(self):
        return self.running

    def stop(self):
        self.running = False


class StandbySpare(Spare):
    """A spare launched ahead as a standby (agrpo/launchers/standby_spare.py): `start()` is then a go, not a boot."""

    def __init__(self, name: str, port: int):
        super().__init__(name, port)
        self.stood_by, self.waiting = 0, False

    def stand_by(self):
        self.stood_by, self.waiting = self.stood_by + 1, True

    def standing_by(self):
        return self.waiting

    def start(self):
        self.waiting = False
        super().start()

    def stop(self):
        self.waiting = False
        super().stop()


class Proxy:
    """/proxy/stats, the replicas' /metrics and the admin routes, recorded."""

    def __init__(self):
        self.replicas = [{"index": 0, "url": "http://127.0.0.1:8100", "healthy": True}]
        self.requests: list[tuple[str, str]] = []
        self.running_on_1 = 0.0

    def get(self, url: str) -> bytes:
        if url.endswith("/proxy/stats"):
            return json.dumps({"replicas": self.replicas}).encode()
        running = self.running_on_1 if ":8101" in url else 1.0
        return f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n".encode()

    def send(self, method: str, url: str, body: dict, token: str) -> bytes:
        assert token == "admin" and url.endswith("/proxy/replicas")
        self.requests.append((method, body["url"]))
        if method == "POST":
            self.replicas.append({"index": 1, "url": body["url"], "healthy": True})
            return json.dumps({"healthy": True}).encode()
        self.replicas = [r for r in self.replicas if r["url"] != body["url"]]
        return b"{}"


def steps(run_dir, count: int, step_s: float, wait_s: float) -> None:
    for _ in range(count):
        files.append_step(run_dir, {"perf/step_s": step_s, "perf/rollout_wait_s": wait_s})


def test_add_judge_release_and_count(tmp_path):
    clock, proxy, lines = Clock(), Proxy(), []
    spare, supervised, started = Spare("vllm-1", 8101), [], []
    ready = {"yes": False}
    fleet = FleetController(
        run_dir=str(tmp_path),
        proxy_url="http://proxy",
        admin_token="admin",
        spares=[spare],
        supervised=supervised,
        started=started,
        knobs=Knobs(min_replicas=1, max_replicas=2, window_steps=5, cooldown_s=10, backoff_s=100),
        poll_s=1.0,
        drain_timeout_s=30.0,
        say=lines.append,
        clock=clock,
        get=proxy.get,
        send=proxy.send,
        healthy=lambda url: ready["yes"],
    )
    steps(tmp_path, 5, step_s=2.0, wait_s=1.5)  # the trainer waits 75% of each step
    clock.t = 10.0
    fleet.poll()
    assert spare.running and started == [spare] and proxy.requests == []
    assert lines[-1].startswith("agrpo fleet: 1 -> 2 replicas (vllm-1 starting): generation-bound")
    clock.t = 40.0
    fleet.poll()  # started, not healthy yet: not handed to the proxy
    assert proxy.requests == [] and fleet.replicas == 1
    ready["yes"] = True
    clock.t = 50.0
    fleet.poll()
    assert proxy.requests == [("POST", "http://127.0.0.1:8101")]
    assert fleet.replicas == 2 and supervised == [spare]
    assert lines[-1] == "agrpo fleet: 2 replica(s) serving: vllm-1 admitted after 40 s"
    # replica-seconds count the newcomer from its start (it costs while it boots): 10 s x 1 + 40 s x 2
    assert files.fleet_figures(tmp_path) == {"fleet/replicas": 2.0, "fleet/replica_seconds": 90.0}

    # the two steps right after the admission began on one replica and warm the newcomer (settle_steps=2): slow, and
    # left out of the judged window; counted as trained samples all the same
    steps(tmp_path, 2, step_s=4.0, wait_s=3.5)
    steps(tmp_path, 4, step_s=1.0, wait_s=0.02)  # twice the steps/s, hardly any wait
    clock.t = 51.0
    fleet.poll()
    assert "kept" not in lines[-1] and "undo" not in lines[-1]  # 4 of 5 steps: not judged yet
    steps(tmp_path, 1, step_s=1.0, wait_s=0.02)
    clock.t = 52.0
    fleet.poll()
    assert "kept the add: steps/s 0.50 -> 1.00" in lines[-1]
    clock.t = 70.0  # past the cool-down: the same window now says the replicas idle
    fleet.poll()
    assert lines[-1].startswith("agrpo fleet: 2 -> 1 replicas (vllm-1 draining): replicas idle")
    assert proxy.requests[-1] == ("DELETE", "http://127.0.0.1:8101") and supervised == []
    proxy.running_on_1 = 2.0  # requests still in flight on it: it is not stopped yet
    clock.t = 72.0
    fleet.poll()
    assert spare.running and fleet.replicas == 2
    proxy.running_on_1 = 0.0
    clock.t = 74.0
    fleet.poll()
    # drained: out of the proxy and the count, but parked (running, and costing) until the release is judged
    assert spare.running and fleet.replicas == 1 and fleet.parked is spare
    assert (
        lines[-1] == "agrpo fleet: 1 replica(s) serving: vllm-1 drained after 4 s, parked until the release is judged"
    )
    assert 3 not in fleet.seconds_by_size  # a parked replica counts beside the serving one, never as a third
    clock.t = 80.0
    assert fleet.finish().splitlines() == [
        "agrpo fleet: 150 replica-seconds (1 replica(s) 10 s, 2 replica(s) 70 s); 2 change(s), 1 replica(s) at the end",
        "  used         150 replica-seconds (1 replica(s) 10 s, 2 replica(s) 70 s)",
        "  fixed max    2 replica(s) for the same 80 s: 160 replica-seconds; auto used 94% of it",
    ]


def released_and_parked(tmp_path, spare: Spare | None = None) -> tuple[FleetController, Spare, Proxy, Clock, list[str]]:
    """A fleet that added vllm-1, kept it, then released it (the trainer stopped waiting) and parked it."""
    clock, proxy, lines, spare = Clock(), Proxy(), [], spare or Spare("vllm-1", 8101)
    knobs = Knobs(min_replicas=1, max_replicas=2, window_steps=5, cooldown_s=10, backoff_s=100)
    fleet = FleetController(
        str(tmp_path), "http://proxy", "admin", [spare], [], [], knobs, poll_s=1.0, say=lines.append, clock=clock,
        get=proxy.get, send=proxy.send, healthy=lambda url: True,
    )  # fmt: skip
    steps(tmp_path, 5, step_s=2.0, wait_s=1.5)
    for t in (10.0, 11.0, 12.0):  # decided, healthy and handed over, admitted
        clock.t = t
        fleet.poll()
    steps(tmp_path, 2 + 5, step_s=1.0, wait_s=0.0)  # settle steps, then twice the steps/s and no wait
    for t in (13.0, 30.0, 31.0):  # kept; past the cool-down: released; drained (nothing in flight): parked
        clock.t = t
        fleet.poll()
    assert fleet.parked is spare and spare.running and fleet.replicas == 1, lines
    return fleet, spare, proxy, clock, lines


def test_a_kept_release_stops_the_parked_replica(tmp_path):
    fleet, spare, proxy, clock, lines = released_and_parked(tmp_path)
    steps(tmp_path, 2 + 5, step_s=1.0, wait_s=0.0)  # the settle steps, then a window as fast, the trainer not waiting
    clock.t = 32.0
    fleet.poll()
    assert "kept the release" in lines[-2] and lines[-1] == "agrpo fleet: vllm-1 stopped: the release was kept"
    assert not spare.running and fleet.parked is None


def test_a_standby_spare_is_told_to_serve_costs_from_then_and_stands_by_again_once_stopped(tmp_path):
    spare = StandbySpare("vllm-1", 8101)
    spare.stand_by()  # the launcher does this when the run starts (agrpo/launchers/fleet_run.py)
    fleet, spare, proxy, clock, lines = released_and_parked(tmp_path, spare)
    assert "(vllm-1 starting from its standby)" in lines[0] and spare.stood_by == 1
    steps(tmp_path, 2 + 5, step_s=1.0, wait_s=0.0)
    clock.t = 32.0
    fleet.poll()
    assert lines[-1] == "agrpo fleet: vllm-1 stopped: the release was kept"
    assert spare.stood_by == 2 and spare.standing_by()  # a later addition is quick too
    assert fleet.seconds_by_size[1] == 10.0  # the standby's first 10 s cost nothing; from the addition on, 2


def test_an_undone_release_readmits_the_parked_replica_without_a_boot(tmp_path):
    fleet, spare, proxy, clock, lines = released_and_parked(tmp_path)
    starts = []
    spare.start = lambda: starts.append(1)  # a boot would call this
    steps(tmp_path, 2 + 5, step_s=2.0, wait_s=1.5)  # half the steps/s, the trainer waiting again
    clock.t = 32.0
    fleet.poll()
    assert lines[-1].startswith("agrpo fleet: 1 -> 2 replicas (vllm-1 back from parked): undo the release")
    clock.t = 33.0
    fleet.poll()
    assert lines[-1] == "agrpo fleet: 2 replica(s) serving: vllm-1 admitted after 1 s"
    assert starts == [] and spare.running and fleet.replicas == 2 and fleet.parked is None
    assert proxy.requests[-1] == ("POST", "http://127.0.0.1:8101")  # the proxy replays the adapters to it


def test_a_spare_that_dies_while_starting_is_given_up_and_not_retried_at_once(tmp_path):
    clock, proxy, lines = Clock(), Proxy(), []
    spare = Spare("vllm-1", 8101)
    fleet = FleetController(
        str(tmp_path),
        "http://proxy",
        "admin",
        [spare],
        [],
        [],
        Knobs(backoff_s=100),
        poll_s=1.0,
        say=lines.append,
        clock=clock,
        get=proxy.get,
        send=proxy.send,
        healthy=lambda url: False,
    )
    steps(tmp_path, 5, step_s=2.0, wait_s=1.5)
    clock.t = 5.0
    fleet.poll()
    spare.running = False  # it exited before becoming healthy
    clock.t = 7.0
    fleet.poll()
    assert "vllm-1 did not start" in lines[-1] and fleet.replicas == 1 and proxy.requests == []
    clock.t = 9.0
    fleet.poll()
    assert not spare.running  # backing off: not started again


def test_a_requeued_or_resumed_run_goes_on_from_the_earlier_attempts_figures_and_not_its_steps(tmp_path):
    """The trainer Job's next attempt (or a resumed local run) starts a new controller in the same run dir: the
    replica-seconds and samples add to the earlier attempt's; its step entries are not in the new first window."""
    files.write_state(
        tmp_path, {"replicas": 2, "replica_seconds": 200.0, "seconds_by_size": {"2": 100.0}, "samples": 64}
    )
    steps(tmp_path, 5, step_s=2.0, wait_s=1.5)  # the earlier attempt's generation-bound steps
    clock, proxy, lines = Clock(), Proxy(), []
    fleet = FleetController(
        str(tmp_path), "http://proxy", "admin", [Spare("vllm-1", 8101)], [], [], Knobs(), poll_s=1.0,
        say=lines.append, clock=clock, get=proxy.get, send=proxy.send, healthy=lambda url: False,
    )  # fmt: skip
    clock.t = 5.0
    fleet.poll()
    assert fleet.pending is None and fleet.window == []  # nothing to decide on yet
    files.append_step(tmp_path, {"perf/step_s": 1.0, "perf/rollout_wait_s": 0.0, "batch/samples_per_step": 16})
    clock.t = 10.0
    fleet.poll()
    assert fleet.samples == 80 and fleet.seconds_by_size == {2: 100.0, 1: 10.0}
    assert fleet.finish().splitlines()[1] == (
        "  used         210 replica-seconds (1 replica(s) 10 s, 2 replica(s) 100 s) for 80 samples trained"
    )


def grown_fleet(tmp_path, recent_steps: int) -> tuple[FleetController, Clock, list[str]]:
    """A fleet that added vllm-1 and kept it, then trained 40 steps that waited a third of each step: at its
    largest, between the add and the release shares (it holds)."""
    clock, proxy, lines = Clock(), Proxy(), []
    fleet = FleetController(
        str(tmp_path), "http://proxy", "admin", [Spare("vllm-1", 8101)], [], [],
        Knobs(window_steps=5, recent_steps=recent_steps, cooldown_s=0, backoff_s=100), poll_s=1.0, settle_steps=0,
        say=lines.append, clock=clock, get=proxy.get, send=proxy.send, healthy=lambda url: True,
    )  # fmt: skip
    steps(tmp_path, 5, step_s=2.0, wait_s=1.5)
    for tick in (1.0, 2.0, 3.0):  # add, admitted (the proxy answers healthy at once)
        clock.t = tick
        fleet.poll()
    steps(tmp_path, 5, step_s=1.0, wait_s=0.3)
    clock.t = 4.0
    fleet.poll()
    assert "kept the add" in lines[-1]
    steps(tmp_path, 40, step_s=1.0, wait_s=0.3)
    clock.t = 5.0
    fleet.poll()
    assert fleet.replicas == 2 and fleet.pending is None
    return fleet, clock, lines


def test_a_new_regime_shows_within_the_recent_steps(tmp_path):
    """Once the trainer is the slow part (it stops waiting), the latest recent_steps steps say so: the fleet releases
    a replica after 10 quiet steps, not after the ~500 a window of every step since the change would need."""
    fleet, clock, lines = grown_fleet(tmp_path, recent_steps=10)
    steps(tmp_path, 10, step_s=2.0, wait_s=0.0)
    clock.t = 6.0
    fleet.poll()
    assert lines[-1].startswith("agrpo fleet: 2 -> 1 replicas (vllm-1 draining): replicas idle: the trainer waited "
                                "only 0% of each step"), lines[-1]  # fmt: skip


def test_without_a_recent_cap_the_old_steps_hold_the_release_back(tmp_path):
    fleet, clock, lines = grown_fleet(tmp_path / "whole", recent_steps=1000)
    steps(tmp_path / "whole", 10, step_s=2.0, wait_s=0.0)
    clock.t = 6.0
    fleet.poll()
    assert fleet.pending is None and fleet.replicas == 2  # 12 s of waits over 60 s of steps: 20%, it holds
