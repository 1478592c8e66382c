"""inference.replicas=auto on Jobs through the fake Hub (tests/fakes/fake_hub.py: a local HTTP server answering
huggingface_hub's routes, standing in for the Hub and the Jobs proxy in front of exposed ports, which these machines
cannot reach). huggingface_hub's own HfApi makes every call. No vLLM: a replica Job here is a scripted Job whose
exposed port answers /health (and /metrics with nothing running); agrpo's proxy is a recorder of its admin routes.

Two halves: the trainer Job's side (its fleet controller launches a replica Job from the uploaded fleet record,
checks its health through the Jobs proxy with the token, replaces a lost one below min_replicas, cancels on release)
and the launching side (the fleet record is uploaded; at the end every replica Job of the launch, those the trainer
Job launched too, is cancelled and listed with its running time and cost, beside the fleet's cost lines)."""

from __future__ import annotations

import json

from fakes.fake_hub import FAKE_TOKEN, FakeHub, use_fake_hub

from agrpo.fleet import files
from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.fleet_jobs import jobs_fleet_plan
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from agrpo.launchers.plan import Plan, ProcessSpec, Supervision
from agrpo.proxy.settings import ADMIN_TOKEN_ENV
from tests.specs import spec_for, with_values

BUCKET = "alice/agrpo-runs"


def plan_for(hub, tmp_path, *extra):
    cfg = spec_for(
        *["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"],
        *["launcher.hf_jobs.namespace=alice", "launcher.hf_jobs.install='agrpo==0.1.0'"],
        *["inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2"],
        *["launcher.hf_jobs.poll_interval_s=0.01", "launcher.hf_jobs.ready_timeout_s=2"],
        *[f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'", *extra],
    )
    return cfg, build_jobs_plan(cfg, launch_id="L1")


class ProxyAdmin:
    """agrpo's proxy as the controller sees it: /proxy/stats and its admin routes, recorded."""

    def __init__(self, url: str):
        self.url, self.admitted, self.requests = url, [], []

    def stats(self) -> bytes:
        return json.dumps({"replicas": [{"url": u, "healthy": True} for u in self.admitted]}).encode()

    def send(self, method, url, body, token):
        assert token == "admin" and url == f"{self.url}/proxy/replicas"
        self.requests.append((method, body["url"]))
        if method == "POST":
            self.admitted.append(body["url"])
        else:
            self.admitted.remove(body["url"])
        return b'{"healthy": true}' if method == "POST" else b"{}"


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_the_trainer_jobs_fleet_launches_checks_replaces_and_cancels_replica_jobs(tmp_path, monkeypatch):
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        cfg, plan = plan_for(hub, tmp_path)
        hub.create_bucket(BUCKET)  # the launcher created it (a Job mounting a missing bucket is refused)
        first = hub.add_job({**plan.replicas[0].labels, "name": "run1-vllm-0"})  # the launcher's, serving
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "fleet.json").write_text(plan.fleet.to_json())  # as uploaded, read through the mount
        fleet = jobs_fleet_plan(with_values(cfg, {"sync.output_dir": str(run_dir)}), make_api())
        proxy = ProcessSpec("proxy", "proxy", ["proxy"], {ADMIN_TOKEN_ENV: "admin"}, port=8101)
        local = Plan("local", str(run_dir), [proxy], ProcessSpec("t", "trainer", ["t"]), "", fleet=fleet)
        local.supervision = Supervision(600.0)
        controller = fleet.build_controller(local, [], [])
        admin, clock, lines = ProxyAdmin("http://127.0.0.1:8101"), Clock(), []
        admin.admitted = [f"{hub.url}/expose/{first.id}/8000"]
        real_get = controller.get
        controller.get = lambda url: admin.stats() if url.startswith(admin.url) else real_get(url)
        controller.send, controller.clock, controller.say = admin.send, clock, lines.append
        controller.last_tick, controller.last_poll, controller.poll_s = 0.0, -1.0, 1.0
        assert controller.replicas == 1 and controller.watched[0].job_id == first.id

        for _ in range(5):
            files.append_step(run_dir, {"perf/step_s": 2.0, "perf/rollout_wait_s": 1.5, "batch/samples_per_step": 8})
        clock.t = 5.0
        controller.poll()  # generation-bound: a replica Job from the record
        launched = hub.created()[-1]
        assert launched["labels"] == {**plan.replicas[0].labels, "name": "run1-vllm-1"}
        template = plan.fleet.replica
        assert (launched["flavor"], launched["dockerImage"], launched["timeoutSeconds"]) == (
            template.flavor,
            template.image,
            template.timeout_s,
        )
        assert launched["command"] == template.command and launched["secrets"] == {"HF_TOKEN": FAKE_TOKEN}
        second = list(hub.jobs.values())[-1]
        clock.t = 7.0
        controller.poll()  # healthy through the Jobs proxy (with the token): admitted
        health = [r for r in hub.requests if r.path == f"/expose/{second.id}/8000/health"]
        assert health and health[-1].headers["Authorization"] == f"Bearer {FAKE_TOKEN}"
        assert admin.requests == [("POST", f"{hub.url}/expose/{second.id}/8000")] and controller.replicas == 2

        second.stage, second.message = "ERROR", "preempted"
        first.stage, first.message = "ERROR", "exit code 1"
        clock.t = 9.0
        controller.poll()  # both lost: below min_replicas=1, so one is launched in their place
        assert any("run1-vllm-1 lost (Job " in line and "ERROR: preempted" in line for line in lines)
        assert not any("kept the add" in line or "undo the add" in line for line in lines)  # not judged on a loss
        clock.t = 11.0
        controller.poll()
        assert hub.created()[-1]["labels"]["name"] == "run1-vllm-2" and controller.replaced == 1
        third = list(hub.jobs.values())[-1]
        clock.t = 13.0
        controller.poll()
        assert controller.replicas == 1 and admin.admitted == [f"{hub.url}/expose/{third.id}/8000"]
        end = controller.finish().splitlines()
        assert "; 2 lost, 1 replaced" in end[0] and "for 40 samples trained: $" in end[1]


def trainer_job_with_a_fleet(hub):
    """The trainer Job as the fake Hub plays it: it launches a second replica Job (as its fleet controller would),
    writes the fleet's figures and its results into the run's folder, logs two lines and completes."""

    def on_create(job):
        labels = job.spec["labels"]
        if labels["agrpo-role"] == "replica":
            job.running_s = 600.0
            return
        added = hub.add_job({**labels, "agrpo-role": "replica", "name": "run1-vllm-1"})
        added.running_s = 300.0
        job.running_s = 580.0
        state = {"replicas": 2, "replica_seconds": 900, "seconds_by_size": {"1": 300, "2": 300}, "max_replicas": 2}
        hub.write_file(BUCKET, "run1/fleet/state.json", json.dumps({**state, "samples": 800}).encode())
        hub.write_file(BUCKET, "run1/metrics.json", json.dumps({"global_step": 100}).encode())
        history = [{"step": 100, "batch/samples_per_step": 8}]
        hub.write_file(BUCKET, "run1/log_history.json", json.dumps(history).encode())
        job.logs, job.stage_after_logs = ["step 1 reward 0.1", "agrpo fleet: 1 -> 2 replicas"], "COMPLETED"

    return on_create


def test_the_launch_uploads_the_record_cancels_every_replica_job_and_prices_the_fleet(tmp_path, monkeypatch, capsys):
    hub = FakeHub()
    hub.on_create = trainer_job_with_a_fleet(hub)
    with hub:
        use_fake_hub(monkeypatch, hub)
        _, plan = plan_for(hub, tmp_path)
        JobsRun(plan, make_api(), echo=print).execute()
    assert hub.uploads[BUCKET]["run1/fleet.json"].decode() == plan.fleet.to_json()
    replica0, trainer, added = hub.jobs.values()
    assert sorted(hub.cancelled()) == sorted([replica0.id, added.id])  # the trainer Job's replica Job too
    out = capsys.readouterr().out
    assert "agrpo: HF Jobs run run1: 1 replica Job(s) + 1 trainer Job in alice" in out
    jobs = [line.split() for line in out.splitlines() if line.startswith("    replica ")]
    assert jobs == [  # every replica Job that existed, with its running time and cost
        ["replica", "run1-vllm-0", "h200", "CANCELED", "10m00s", "$0.83"],
        ["replica", "run1-vllm-1", "h200", "CANCELED", "5m00s", "$0.42"],
    ]
    assert "  fleet        1..2 replica Jobs (auto)" in out
    assert (
        "  used         900 replica-seconds (1 replica(s) 300 s, 2 replica(s) 300 s) for 800 samples trained: $1.25, $1.56 per 1,000"
        in out
    )
    assert "  fixed max    2 replica(s) for the same 600 s: 1200 replica-seconds: $1.67" in out and "75% of it" in out
