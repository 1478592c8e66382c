"""inference.replicas=auto on Jobs, as plan data (pure, no Hub): the launcher starts min_replicas replica Jobs; the
fleet record the trainer Job launches from is the plan's replica Job (same image, flavor, command, env, secrets,
volume, port, labels, timeout); the dry run prints the fleet range and the whole run's cost range; the trainer Job
starts on any number of running replica Jobs within the range."""

from __future__ import annotations

import dataclasses
import json

import pytest
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems
from agrpo.launchers.hf_jobs.cost import RunEstimate
from agrpo.launchers.hf_jobs.fleet import JobsFleet
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from agrpo.launchers.hf_jobs.trainer import expected_replicas
from tests.specs import spec_for

BASE = ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"]
AUTO = ["inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=4"]


def plan_of(*overrides):
    assert find_problems(compose_run_config([*BASE, "launcher.hf_jobs.namespace=alice", *overrides])) == []
    return build_jobs_plan(spec_for(*BASE, "launcher.hf_jobs.namespace=alice", *overrides), launch_id="L1")


def test_the_launcher_starts_min_replicas_and_the_template_is_a_replica_job_of_the_plan():
    plan = plan_of(*AUTO, "inference.min_replicas=2")
    assert [job.name for job in plan.replicas] == ["run1-vllm-0", "run1-vllm-1"]
    fleet = plan.fleet
    assert (fleet.min_replicas, fleet.max_replicas) == (2, 4)
    spec = fleet.spec(5)
    assert spec.name == "run1-vllm-5"
    first = plan.replicas[0]
    same = ("role", "image", "flavor", "command", "env", "secrets", "volumes", "labels", "timeout_s", "expose")
    assert {k: getattr(spec, k) for k in same} == {k: getattr(first, k) for k in same}
    assert spec.labels == {"agrpo-run": "run1", "agrpo-role": "replica", "agrpo-launch": "L1"}
    assert fleet.policy["max_replacements"] == 3 and fleet.policy["window_steps"] == 5
    assert fleet.path_in_bucket == "run1/fleet.json" and fleet.job_path == "/bucket/run1/fleet.json"


def test_the_fleet_record_travels_as_json_and_is_uploaded_beside_the_config():
    plan = plan_of(*AUTO)
    uploads = dict((path, data) for data, path in plan.files())
    assert set(uploads) == {"run1/config.yaml", "run1/fleet.json"}
    record = JobsFleet.from_json(uploads["run1/fleet.json"].decode())
    assert record == plan.fleet
    assert "HF_TOKEN" in json.loads(uploads["run1/fleet.json"])["replica"]["secrets"]  # a name, never a value
    config = OmegaConf.create(uploads["run1/config.yaml"].decode())
    assert config.inference.replicas == "auto" and config.role == "trainer"  # the trainer Job sizes the fleet


def test_a_fixed_fleet_has_no_fleet_record():
    plan = plan_of("inference.replicas=2")
    assert plan.fleet is None and [path for _, path in plan.files()] == ["run1/config.yaml"]
    assert "[fleet]" not in plan.render()


def test_the_dry_run_prints_the_fleet_range_and_the_cost_range():
    text = plan_of(*AUTO, "trainer.max_steps=240", "launcher.hf_jobs.estimated_step_s=30").render()
    assert "estimated cost: $10.00..$25.00/hour for 1..4 replica Job(s) + 1 trainer Job" in text
    # 240 steps x 30 s = 2 h; h200 trainer $5/h + 1..4 h200 replicas at $5/h
    assert "estimated cost of the whole run: $20.00..$50.00 for 1..4 replica Job(s) + 1 trainer Job over ~2h00m" in text
    assert "an estimate" in text and "at most $150.00 (launcher.hf_jobs.trainer_timeout_s=21600" in text
    assert "[fleet] auto: 1..4 replica Jobs; the launcher starts 1, the trainer Job launches and cancels" in text
    assert "[replica] (on demand, launched by the trainer Job) run1-vllm-1" in text
    assert (
        "upload this fleet record (the replica Job template below) to bucket alice/agrpo-runs:run1/fleet.json" in text
    )


@pytest.mark.parametrize(
    "estimate, low, high, cap",
    [
        (RunEstimate(120, 30.0, 1, 1, 5.0, 5.0, 3600), 10.0, 10.0, 10.0),  # fixed: one figure
        (RunEstimate(120, 30.0, 1, 8, 5.0, 10.0, 7200), 15.0, 50.0, 100.0),  # the blog's: h200 replicas, h200x2
        (RunEstimate(100, 36.0, 2, 3, None, 1.0, 3600), 1.0, 1.0, 1.0),  # an unpriced flavor counts $0
    ],
)
def test_the_whole_run_estimate(estimate, low, high, cap):
    assert estimate.usd_range() == pytest.approx((low, high)) and estimate.cap_usd() == pytest.approx(cap)
    assert ("counts $0" in estimate.render()) == (estimate.replica_per_hour is None)


@pytest.mark.parametrize(
    "replicas, found, ok",
    [("2", 2, True), ("2", 1, False), ("2", 3, False), ("auto", 0, False), ("auto", 1, True), ("auto", 4, True)]
    + [("auto", 5, False)],
)
def test_the_trainer_job_starts_on_the_fixed_number_or_within_the_range(replicas, found, ok):
    inference = OmegaConf.create({"replicas": replicas, "min_replicas": 2, "max_replicas": 4})
    assert expected_replicas(inference, found) is ok


def test_a_rehearsal_binds_the_gateway_port_in_the_template_too():
    from agrpo.launchers.hf_jobs.plan import bind_placeholder
    from agrpo.rehearsal.rehearse import GATEWAY_PLACEHOLDER

    from agrpo.config.validate import value_problems
    from agrpo.rehearsal.backend import RehearsalHub

    cfg = compose_run_config([*BASE, "launcher.hf_jobs.namespace=alice", *AUTO, "inference.device=cpu"])
    assert value_problems(cfg, jobs_on_this_machine=True) == []  # CPU replicas on GPU flavors: Jobs run here
    spec = spec_for(*BASE, "launcher.hf_jobs.namespace=alice", *AUTO, "inference.device=cpu", jobs_on_this_machine=True)
    plan = build_jobs_plan(spec, launch_id="L1", hub=RehearsalHub())
    bound = bind_placeholder(plan, GATEWAY_PLACEHOLDER, "4242")
    assert GATEWAY_PLACEHOLDER not in json.dumps(dataclasses.asdict(bound))
    assert bound.fleet.replica.url.endswith(".hf.jobs:4242")
    assert "hf.jobs:4242" in OmegaConf.create(bound.config.text).launcher.hf_jobs.replica_url
