"""`agrpo jobs status|logs|cancel RUN_ID` against a fake Hub (the real one cannot be reached from these machines).

Jobs are found by their agrpo-run label only: another run's Jobs are never touched.
"""

import sys

import pytest
from fakes.fake_hub import FAKE_TOKEN, FakeHub, use_fake_hub

from agrpo.launchers.hf_jobs.cli import main


@pytest.fixture()
def hub(monkeypatch):
    with FakeHub() as fake:
        use_fake_hub(monkeypatch, fake)
        fake.r0 = fake.add_job({"agrpo-run": "run1", "agrpo-role": "replica", "name": "run1-vllm-0"})
        fake.r1 = fake.add_job({"agrpo-run": "run1", "agrpo-role": "replica", "name": "run1-vllm-1"}, stage="ERROR")
        fake.t = fake.add_job({"agrpo-run": "run1", "agrpo-role": "trainer", "name": "run1-trainer"})
        fake.other = fake.add_job({"agrpo-run": "run2", "agrpo-role": "replica", "name": "run2-vllm-0"})
        fake.t.logs = ["step 1", "step 2", "done"]
        yield fake


def test_cancel_by_label_cancels_only_that_runs_live_jobs(hub, capsys):
    assert main(["cancel", "run1"]) == 0
    assert sorted(hub.cancelled()) == sorted([hub.r0.id, hub.t.id])  # the errored Job is already over
    assert [hub.r0.stage, hub.r1.stage, hub.t.stage, hub.other.stage] == ["CANCELED", "ERROR", "CANCELED", "RUNNING"]
    listing = [r for r in hub.calls("GET", "/api/jobs/alice") if r.path == "/api/jobs/alice"]
    assert listing[0].query == [("label", "agrpo-run=run1")]
    assert "cancelled 2 Job(s) of run run1" in capsys.readouterr().out
    assert main(["cancel", "run1"]) == 0
    assert "(all were already over)" in capsys.readouterr().out


def test_status_lists_every_job_of_the_run_with_the_spend_so_far(hub, capsys):
    hub.prices = {"h200": 4.2}  # the Jobs API's hardware list wins over agrpo's table
    hub.r0.running_s, hub.r1.running_s, hub.t.running_s = 1800, 600, 3600
    assert main(["status", "run1", "--namespace", "alice"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["JOB", "ID", "ROLE", "STAGE", "FLAVOR", "NAME", "RUNNING", "COST", "URL"]
    rows = [line.split()[:7] for line in out[1:-1]]
    assert rows == [
        [hub.r0.id, "replica", "RUNNING", "h200", "run1-vllm-0", "30m00s", "$2.10"],
        [hub.r1.id, "replica", "ERROR", "h200", "run1-vllm-1", "10m00s", "$0.70"],
        [hub.t.id, "trainer", "RUNNING", "h200", "run1-trainer", "1h00m", "$4.20"],
    ]
    assert out[-1] == "spend so far: $7.00, 2 Job(s) still running (prices: the Jobs API's hardware list)"
    assert hub.calls("GET", "/api/whoami-v2") == []  # --namespace given: no lookup
    hub.hardware_down = True  # the list cannot be read: agrpo's table, marked as an estimate
    assert main(["status", "run1", "--namespace", "alice"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("spend so far: $8.33, 2 Job(s) still running (prices: agrpo's price table")


def test_logs_prints_the_trainers_logs_by_default_or_a_named_job(hub, capsys):
    assert main(["logs", "run1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["step 1", "step 2", "done"]
    hub.r1.logs = ["vllm starting"]
    assert main(["logs", "run1", "--role", "run1-vllm-1"]) == 0
    assert capsys.readouterr().out.splitlines() == ["vllm starting"]


def test_unknown_run_is_an_error_and_the_token_is_never_printed(hub, capsys):
    assert main(["status", "nope"]) == 1
    captured = capsys.readouterr()
    assert "no Job labelled agrpo-run=nope in alice" in captured.err
    assert FAKE_TOKEN not in captured.out + captured.err


def test_agrpo_jobs_is_dispatched_here_by_the_entrypoint(hub, monkeypatch):
    from agrpo import cli

    monkeypatch.setattr(sys, "argv", ["agrpo", "jobs", "cancel", "run2"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 0 and hub.other.stage == "CANCELED" and hub.t.stage == "RUNNING"


def test_a_hub_refusal_is_one_line_not_a_traceback(hub, capsys):
    assert main(["status", "run1", "--namespace", "bob"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agrpo jobs: the Hub refused: 403") and len(err.strip().splitlines()) == 1
