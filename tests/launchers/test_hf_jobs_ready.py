"""The replica readiness loop (pure): stages and /health answers are scripted, time is a fake clock.

No Hub here; the fake-Hub version of the same loop is in test_hf_jobs_launch.py (the real Hub cannot be reached
from these machines).
"""

import pytest

from agrpo.launchers.hf_jobs.ready import ReplicaJob, ReplicaNotReady, wait_until_ready

REPLICAS = [
    ReplicaJob("r-vllm-0", "j0", "https://j0--8000.hf.jobs"),
    ReplicaJob("r-vllm-1", "j1", "https://j1--8000.hf.jobs"),
]


class Script:
    """Per-job sequences of (stage, message) and per-URL sequences of health answers; the last value repeats."""

    def __init__(self, stages, health):
        self.stages, self.health, self.now, self.probed = stages, health, 0.0, []

    def stage(self, job_id):
        seq = self.stages[job_id]
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def probe(self, url):
        self.probed.append(url)
        seq = self.health[url]
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def sleep(self, seconds):
        self.now += seconds

    def run(self, timeout_s=100.0, **kwargs):
        return wait_until_ready(
            REPLICAS, self.stage, self.probe, timeout_s, 10.0, clock=lambda: self.now, sleep=self.sleep, **kwargs
        )


def test_ready_once_every_replica_is_running_and_healthy():
    script = Script(
        {"j0": [("SCHEDULING", None), ("RUNNING", None)], "j1": [("RUNNING", None)]},
        {
            REPLICAS[0].url: [(True, "HTTP 200")],
            REPLICAS[1].url: [(False, "ConnectionError"), (False, "HTTP 503"), (True, "HTTP 200")],
        },
    )
    ready = []
    took = script.run(on_ready=lambda r, s: ready.append((r.name, s)))
    assert took == 20.0
    assert ready == [("r-vllm-0", 10.0), ("r-vllm-1", 20.0)]
    # A scheduling Job is not probed; a healthy replica is not probed again.
    assert script.probed == [REPLICAS[1].url, REPLICAS[0].url, REPLICAS[1].url, REPLICAS[1].url]


def test_a_job_that_ends_early_fails_at_once_with_its_stage_and_message():
    script = Script(
        {"j0": [("RUNNING", None)], "j1": [("SCHEDULING", None), ("ERROR", "no h200 capacity")]},
        {REPLICAS[0].url: [(False, "HTTP 503")]},
    )
    with pytest.raises(ReplicaNotReady) as error:
        script.run()
    assert error.value.replica is REPLICAS[1]
    assert (
        str(error.value) == "replica r-vllm-1 (Job j1) ended with stage ERROR before it was healthy: no h200 capacity"
    )
    assert script.now == 10.0


def test_a_replica_never_healthy_fails_at_the_deadline_with_its_last_answer():
    script = Script(
        {"j0": [("RUNNING", None)], "j1": [("RUNNING", None)]},
        {REPLICAS[0].url: [(True, "HTTP 200")], REPLICAS[1].url: [(False, "HTTP 503")]},
    )
    with pytest.raises(ReplicaNotReady) as error:
        script.run(timeout_s=60.0)
    assert error.value.replica is REPLICAS[1]
    assert str(error.value).startswith(
        "replica r-vllm-1 (Job j1) was not healthy after 60 s (last: stage RUNNING, "
        "/health HTTP 503); raise launcher.hf_jobs.ready_timeout_s"
    )
    assert script.now == 60.0


def test_a_job_stuck_scheduling_reports_its_stage():
    script = Script({"j0": [("SCHEDULING", None)], "j1": [("SCHEDULING", None)]}, {})
    with pytest.raises(
        ReplicaNotReady, match=r"r-vllm-0 \(Job j0\) was not healthy after 30 s \(last: stage SCHEDULING\)"
    ):
        script.run(timeout_s=30.0)
    assert script.probed == []
