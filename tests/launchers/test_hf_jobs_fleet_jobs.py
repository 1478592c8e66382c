"""The trainer Job's fleet of replica Jobs (inference.replicas=auto), without sockets: an in-memory Jobs API stands in
for the Hub (run_job, list_jobs, inspect_job, cancel_job; it cannot be reached from here) and recorders for the
proxy's admin routes and the replicas' /health and /metrics. The controller, the Jobs pool and the policy are the
product's: it launches the plan's replica Job template, admits it once healthy, releases by draining then
cancelling, and replaces a lost replica Job only while the fleet is below min_replicas, within the budget."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from agrpo.fleet import files
from agrpo.launchers.hf_jobs.fleet_jobs import JobsFleetPlan
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from agrpo.launchers.plan import Plan, ProcessSpec, Supervision
from agrpo.proxy.settings import ADMIN_TOKEN_ENV

from tests.specs import spec_for

SECRET = "hf_fake_token_for_the_fleet_tests"


class Jobs:
    """The Jobs API in memory: Jobs with labels and stages; each call recorded."""

    def __init__(self):
        self.jobs: dict[str, SimpleNamespace] = {}
        self.created: list[dict] = []
        self.cancelled: list[str] = []

    def add(self, name: str, labels: dict, stage: str = "RUNNING") -> str:
        job_id = f"job{len(self.jobs)}"
        status = SimpleNamespace(stage=stage, message=None)
        self.jobs[job_id] = SimpleNamespace(id=job_id, labels={**labels, "name": name}, status=status, created_at=None)
        return job_id

    def run_job(
        self, *, image, command, env, secrets, flavor, timeout, attempts, name, labels, volumes, expose, namespace
    ):
        kwargs = dict(image=image, command=command, env=env, secrets=secrets, flavor=flavor, timeout=timeout)
        kwargs.update(attempts=attempts, name=name, labels=labels, volumes=volumes, expose=expose, namespace=namespace)
        self.created.append(kwargs)
        return self.jobs[self.add(name, labels, stage="SCHEDULING")]

    def list_jobs(self, labels, namespace):
        return [job for job in self.jobs.values() if all(job.labels.get(k) == v for k, v in labels.items())]

    def inspect_job(self, job_id, namespace):
        return self.jobs[job_id]

    def cancel_job(self, job_id, namespace):
        self.cancelled.append(job_id)
        self.jobs[job_id].status.stage = "CANCELED"

    def list_jobs_hardware(self):
        raise OSError("no hardware list here")  # the table's prices, marked as an estimate

    def end(self, job_id: str, stage: str, message: str) -> None:
        self.jobs[job_id].status.stage, self.jobs[job_id].status.message = stage, message


class Proxy:
    """The proxy's /proxy/stats and admin routes, and every replica's /health and /metrics (idle), recorded."""

    def __init__(self):
        self.admitted: list[str] = []
        self.requests: list[tuple[str, str]] = []

    def get(self, url: str) -> bytes:
        if url.endswith("/proxy/stats"):
            return json.dumps({"replicas": [{"url": u, "healthy": True} for u in self.admitted]}).encode()
        return b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"

    def send(self, method: str, url: str, body: dict, token: str) -> bytes:
        assert token == "admin" and url == "http://127.0.0.1:8101/proxy/replicas"
        self.requests.append((method, body["url"]))
        if method == "POST":
            self.admitted.append(body["url"])
            return b'{"healthy": true}'
        self.admitted = [u for u in self.admitted if u != body["url"]]
        return b"{}"


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fleet_of(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)

    def build(min_replicas: int, max_replicas: int, *overrides):
        cfg = spec_for(
            *["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"],
            *["launcher.hf_jobs.namespace=alice", "inference.replicas=auto"],
            *[f"inference.min_replicas={min_replicas}", f"inference.max_replicas={max_replicas}"],
            *["inference.fleet.cooldown_s=0", *overrides],
        )
        jobs_plan = build_jobs_plan(cfg, launch_id="L1")
        api = Jobs()
        for spec in jobs_plan.replicas:  # what the launcher started and waited for
            api.add(spec.name, spec.labels)
        record = jobs_plan.fleet
        fleet = JobsFleetPlan(
            min_replicas, max_replicas, [], dict(record.policy), None, record=record, namespace="alice",
            run_id="run1", launch_id="L1", url_pattern="https://{job_id}--{port}.hf.jobs", port=8000, refresh_s=0.0,
            api=api,
        )  # fmt: skip
        proxy_spec = ProcessSpec("proxy", "proxy", ["proxy"], {ADMIN_TOKEN_ENV: "admin"}, port=8101)
        trainer = ProcessSpec("trainer", "trainer", ["trainer"])
        plan = Plan("local", str(tmp_path), [proxy_spec], trainer, "", supervision=Supervision(600.0), fleet=fleet)
        controller = fleet.build_controller(plan, [], [])
        proxy, clock, lines = Proxy(), Clock(), []
        proxy.admitted = [f"https://{job_id}--8000.hf.jobs" for job_id in api.jobs]
        controller.get, controller.send, controller.healthy = proxy.get, proxy.send, lambda url: True
        controller.clock, controller.say, controller.poll_s = clock, lines.append, 1.0
        controller.last_tick, controller.last_poll = 0.0, -1.0  # on the test's clock from here
        return SimpleNamespace(api=api, controller=controller, proxy=proxy, clock=clock, lines=lines, plan=jobs_plan)

    return build


def steps(run_dir, count: int, wait_share: float) -> None:
    for _ in range(count):
        files.append_step(run_dir, {"perf/step_s": 2.0, "perf/rollout_wait_s": 2.0 * wait_share})


def poll_at(fleet, t: float) -> None:
    fleet.clock.t = t
    fleet.controller.poll()


def test_an_add_launches_the_plans_template_and_a_release_drains_then_cancels(fleet_of, tmp_path):
    fleet = fleet_of(1, 2)
    controller, api = fleet.controller, fleet.api
    assert controller.replicas == 1 and [r.name for r in controller.watched] == ["run1-vllm-0"]
    steps(tmp_path, 5, wait_share=0.75)  # generation-bound
    poll_at(fleet, 5.0)
    expected = fleet.plan.fleet.spec(1).run_job_kwargs("alice", {"HF_TOKEN": SECRET})
    sent = api.created[-1]
    assert {k: sent[k] for k in ("image", "command", "env", "flavor", "timeout", "name", "labels", "expose")} == {
        k: expected[k] for k in ("image", "command", "env", "flavor", "timeout", "name", "labels", "expose")
    }
    assert sent["secrets"] == {"HF_TOKEN": SECRET} and sent["name"] == "run1-vllm-1"
    assert [v.mount_path for v in sent["volumes"]] == ["/bucket"] and sent["volumes"][0].read_only
    assert "(run1-vllm-1 starting): generation-bound" in fleet.lines[-1]
    new_id = "job1"
    api.jobs[new_id].status.stage = "RUNNING"
    poll_at(fleet, 30.0)  # healthy: handed to the proxy, which admits it
    assert fleet.proxy.requests == [("POST", f"https://{new_id}--8000.hf.jobs")] and controller.replicas == 2
    # then idle; the first 2 steps settle the new fleet (inference.fleet.settle_steps)
    steps(tmp_path, 7, wait_share=0.0)
    poll_at(fleet, 40.0)  # judged (steps/s unchanged: the add is undone) -> drained, its Job cancelled
    assert fleet.proxy.requests[-1] == ("DELETE", f"https://{new_id}--8000.hf.jobs")
    poll_at(fleet, 42.0)
    assert api.cancelled == [new_id] and controller.replicas == 1
    assert "run1-vllm-1 drained and stopped" in fleet.lines[-1]


def test_a_lost_replica_job_is_replaced_only_below_min_and_within_the_budget(fleet_of, tmp_path):
    fleet = fleet_of(2, 3, "inference.fleet.max_replacements=1")
    controller, api = fleet.controller, fleet.api
    assert controller.replicas == 2 and controller.max_replacements == 1
    steps(tmp_path, 5, wait_share=0.75)
    poll_at(fleet, 5.0)
    api.jobs["job2"].status.stage = "RUNNING"
    poll_at(fleet, 10.0)
    assert controller.replicas == 3  # grew on its signals
    api.end("job0", "ERROR", "preempted")
    poll_at(fleet, 12.0)
    assert "agrpo fleet: run1-vllm-0 lost (Job job0 ERROR: preempted); 3 -> 2 replica(s)" in fleet.lines
    assert ("DELETE", "https://job0--8000.hf.jobs") in fleet.proxy.requests
    assert len(api.created) == 1  # still at min_replicas: not replaced for its own sake
    api.end("job1", "ERROR", "exit code 137")
    poll_at(fleet, 14.0)
    poll_at(fleet, 16.0)
    assert len(api.created) == 2 and api.created[-1]["name"] == "run1-vllm-3"  # below min: replaced
    assert any("replace a lost replica: 1 replica(s) serving, below inference.min_replicas=2" in x for x in fleet.lines)
    api.jobs["job3"].status.stage = "RUNNING"
    poll_at(fleet, 18.0)
    assert controller.replicas == 2
    api.end("job3", "CANCELED", "canceled by user")
    poll_at(fleet, 20.0)
    poll_at(fleet, 22.0)
    assert len(api.created) == 2 and controller.replicas == 1  # the budget is spent: it goes on with one
    assert sum("max_replacements=1): going on with 1" in x for x in fleet.lines) == 1  # said once
    end = controller.finish().splitlines()
    assert (
        end[0].endswith("; 3 lost, 1 replaced") and "(priced at $5.00 per replica-hour: h200, agrpo's price" in end[-1]
    )
    state = json.loads((tmp_path / "fleet" / "state.json").read_text())
    assert (state["lost"], state["replaced"], state["max_replicas"]) == (3, 1, 3)


def test_a_refused_launch_reads_as_a_replica_that_did_not_start(fleet_of, tmp_path):
    fleet = fleet_of(1, 2)

    def refuse(**kwargs):
        raise ValueError("flavor h200 is not available in this namespace")

    fleet.api.run_job = refuse
    steps(tmp_path, 5, wait_share=0.75)
    poll_at(fleet, 5.0)
    poll_at(fleet, 7.0)
    assert "run1-vllm-1 did not start (see the Jobs API refused it: ValueError: flavor h200" in fleet.lines[-1]
    assert fleet.controller.replicas == 1 and fleet.controller.pending is None


def test_a_change_is_not_judged_on_a_fleet_a_loss_changed(fleet_of, tmp_path):
    fleet = fleet_of(1, 2)
    steps(tmp_path, 5, wait_share=0.75)
    poll_at(fleet, 5.0)
    fleet.api.jobs["job1"].status.stage = "RUNNING"
    poll_at(fleet, 7.0)
    assert fleet.controller.replicas == 2
    fleet.api.end("job0", "ERROR", "preempted")
    poll_at(fleet, 9.0)
    steps(tmp_path, 5, wait_share=0.0)  # a full window after the loss: the add's judgement would fall here
    poll_at(fleet, 11.0)
    assert fleet.controller.replicas == 1 and fleet.controller.memory.judged
    assert not any("the add" in line for line in fleet.lines), fleet.lines
