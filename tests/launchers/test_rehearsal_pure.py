"""The rehearsal stand-in's pure parts: Job stages and requeue, exposed-port URL forms, the bucket listing's lag and
negative cache, the Job's wrapper command and environment, and what the rehearsal's Hub backend changes in the plan."""

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.hf_jobs_checks import hf_jobs_problems
from agrpo.launchers.hf_jobs.plan import bind_placeholder
from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for
from agrpo.rehearsal import jobs as J
from agrpo.rehearsal.bucket import Visibility, listing
from agrpo.rehearsal.backend import RehearsalHub, RehearsalSettings
from agrpo.rehearsal.rehearse import GATEWAY_PLACEHOLDER
from agrpo.rehearsal.runner import ENV_MARKER, job_env, wrapper_argv
from agrpo.proxy.settings import url_problems

JOB_ID = "0123456789abcdef01234567"


def job(**spec) -> J.JobRecord:
    return J.JobRecord(id=JOB_ID, namespace="alice", spec=spec, created=0.0)


@pytest.mark.parametrize(
    "code, reason, expected",
    [
        (0, None, ("COMPLETED", None)),
        (3, None, ("ERROR", "exit code 3")),
        (-15, "cancel", ("CANCELED", "canceled by user")),
        (-15, "preempt", ("ERROR", "preempted (rehearsal)")),
        (-9, "timeout", ("ERROR", "Job timeout after 60 s")),
    ],
)
def test_a_jobs_end_gives_the_stage_the_service_reports(code, reason, expected):
    assert J.outcome(code, job(timeoutSeconds=60), reason) == expected


def test_a_cancel_request_wins_over_the_exit_code():
    record = job()
    record.cancel_requested = True
    assert J.outcome(0, record, None)[0] == "CANCELED"


def test_only_an_error_with_attempts_left_is_requeued():
    record = job(attempts=2)
    assert J.requeues(record, "ERROR") and not J.requeues(record, "COMPLETED")
    record.attempt = 2
    assert not J.requeues(record, "ERROR")
    assert not J.requeues(job(), "ERROR")  # attempts defaults to 1
    cancelled = job(attempts=3)
    cancelled.cancel_requested = True
    assert not J.requeues(cancelled, "ERROR")


def test_timeout_counts_from_the_start_of_the_running_attempt():
    record = job(timeoutSeconds=10)
    assert not J.timed_out(record, 100.0)  # not running yet
    record.move("RUNNING", now=95.0)
    assert not J.timed_out(record, 104.0) and J.timed_out(record, 105.0)
    assert record.history == ["RUNNING"]


def test_list_jobs_label_filter_needs_every_label():
    record = job(labels={"agrpo-run": "r1", "agrpo-role": "replica"})
    assert J.matches_labels(record, ["agrpo-run=r1"]) and J.matches_labels(record, [])
    assert J.matches_labels(record, ["agrpo-run=r1", "agrpo-role=replica"])
    assert not J.matches_labels(record, ["agrpo-run=r1", "agrpo-role=trainer"])


def test_the_job_body_names_secrets_without_values_and_lists_exposed_urls():
    record = job(secrets={"HF_TOKEN": "hf_value"}, expose={"ports": [8000], "portsPublic": []}, dockerImage="img")
    body = record.to_json("127.0.0.1:4321")
    assert body["secrets"] == {"HF_TOKEN": None} and "hf_value" not in str(body)
    assert body["status"]["exposeUrls"] == [f"http://{JOB_ID}--8000.hf.jobs:4321"]


def test_the_exposed_url_form_is_a_replica_url_the_proxy_accepts():
    url = J.exposed_url(JOB_ID, 8000, "127.0.0.1:4321")
    assert url_problems(url) == []
    assert J.path_form(url, "127.0.0.1:4321") == f"http://127.0.0.1:4321/expose/{JOB_ID}/8000"
    assert J.path_form("http://127.0.0.1:9/", "127.0.0.1:4321") == "http://127.0.0.1:9/"


def test_the_gateway_routes_by_host_or_by_path():
    assert J.route(f"{JOB_ID}--8000.hf.jobs:4321", "/v1/models") == (JOB_ID, 8000, "/v1/models")
    assert J.route("127.0.0.1:4321", f"/expose/{JOB_ID}/8000/health?x=1") == (JOB_ID, 8000, "/health?x=1")
    assert J.route("127.0.0.1:4321", f"/expose/{JOB_ID}/8000") == (JOB_ID, 8000, "/")
    assert J.route("example.com", "/health") is None


def test_the_listing_shows_a_file_only_after_the_lag():
    view = Visibility(lag_s=1.0, negative_cache_s=30.0)
    view.seen("r/a", now=10.0)
    assert listing({"r/a": 5}, "r", view, 10.5) == []
    assert [item["path"] for item in listing({"r/a": 5}, "r", view, 11.0)] == ["r/a"]
    assert listing({"r/a": 5}, "other", view, 11.0) == []
    view.seen("r/b", now=20.0, preexisting=True)  # an acknowledged upload is listed at once
    assert view.visible("r/b", 20.0)


def test_a_path_looked_up_before_it_is_visible_stays_invisible_for_the_negative_cache():
    view = Visibility(lag_s=1.0, negative_cache_s=30.0)
    assert not view.lookup("r/v1/adapter_config.json", now=0.0)  # not even written yet: the miss is cached
    view.seen("r/v1/adapter_config.json", now=0.5)
    assert not view.visible("r/v1/adapter_config.json", 5.0)  # past the lag, still cached as missing
    assert not view.lookup("r/v1/adapter_config.json", 29.0)
    assert view.visible("r/v1/adapter_config.json", 30.0)
    other = Visibility(lag_s=1.0, negative_cache_s=30.0)
    other.seen("p", now=0.0)
    assert other.lookup("p", 2.0)  # a lookup after the lag finds it at once: the gate makes that the normal case


def test_the_wrapper_mounts_the_bucket_at_the_jobs_path_then_execs_its_command(tmp_path):
    argv = wrapper_argv(["python3", "-m", "x"], [("/tmp/b", "/bucket", True)], tmp_path / "hosts", tmp_path, "agns")
    assert argv[:4] == ["ip", "netns", "exec", "agns"] and argv[4:6] == ["unshare", "-m"]
    script = argv[argv.index("-c") + 1]
    assert "mount --bind /tmp/b /bucket" in script and "remount,bind,ro /bucket" in script
    assert f"mount --bind {tmp_path / 'hosts'} /etc/hosts" in script and script.endswith('exec "$@"')
    assert argv[-3:] == ["python3", "-m", "x"]
    assert wrapper_argv(["true"], [], None, tmp_path, None)[0] == "unshare"


def test_a_job_gets_its_env_and_secrets_not_the_launching_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_ONLY_SECRET", "leak")
    env = job_env({"A": "1"}, {"HF_TOKEN": "hf_x"}, tmp_path / "bin", tmp_path, JOB_ID, "http://127.0.0.1:1")
    assert env["A"] == "1" and env["HF_TOKEN"] == "hf_x" and env[ENV_MARKER] == JOB_ID
    assert "LAUNCHER_ONLY_SECRET" not in env and "PYTHONPATH" not in env
    assert env["PATH"].startswith(f"{tmp_path / 'bin'}:") and env["PIP_NO_INDEX"] == "1"


REHEARSAL = [
    "+recipe=smoke",
    "launcher=hf_jobs",
    "sync=bucket",
    "inference.replicas=2",
    "inference.device=cpu",
    "launcher.hf_jobs.run_id=r1",
]


def rehearsal_cfg(*extra):
    return compose_run_config([*REHEARSAL, *extra])


def test_rehearsal_allows_cpu_replicas_but_a_real_launch_does_not():
    assert hf_jobs_problems(rehearsal_cfg(), jobs_on_this_machine=True) == []
    real = hf_jobs_problems(rehearsal_cfg())
    assert len(real) == 1 and "inference.device" in real[0]  # the model built here travels (test_hf_jobs_inputs)
    detached = hf_jobs_problems(rehearsal_cfg("launcher.hf_jobs.detach=true"), jobs_on_this_machine=True)
    assert len(detached) == 1 and "run it without detach" in detached[0]


def test_the_rehearsal_plan_reaches_replicas_through_the_gateway_and_serves_on_cpu():
    spec = spec_for(*REHEARSAL, jobs_on_this_machine=True)
    plan = build_jobs_plan(spec, launch_id="L1", hub=RehearsalHub())
    assert plan.jobs_on_this_machine
    model = plan.inputs[0]  # built here and carried through the bucket, as on a real launch
    assert (model.key, model.builder) == ("model.name_or_path", "agrpo.models.tiny.build_tiny_model")
    assert plan.replicas[0].command[2] == model.job_path == "/bucket/r1/inputs/model"
    assert "listing lag 1 s, negative lookup cache 30 s" in plan.hub_lines[0]
    assert "--distributed-executor-backend" in plan.replicas[0].command
    assert "trl[kernels]==1.16.*" not in plan.trainer.command  # no GPU, no index: no GPU extras in a CPU rehearsal
    assert "rehearse (--rehearse): every Job below runs on this machine" in plan.render()
    bound = bind_placeholder(plan, GATEWAY_PLACEHOLDER, "4321")
    assert bound.replica_url(JOB_ID) == f"http://{JOB_ID}--8000.hf.jobs:4321"
    assert "replica_url: http://{job_id}--{port}.hf.jobs:4321" in bound.config.text
    assert GATEWAY_PLACEHOLDER not in str(bound)


def test_without_namespaces_the_rehearsal_stops_with_one_clear_error(monkeypatch, tmp_path):
    from agrpo.errors import LaunchError
    from agrpo.rehearsal import rehearse

    monkeypatch.setattr(rehearse, "namespaces_available", lambda: "it needs root")
    with pytest.raises(LaunchError, match=r"--rehearse cannot run here: it needs root.*launcher.dry_run=true"):
        with RehearsalHub(RehearsalSettings(dir=str(tmp_path))).connect("alice", {}):
            raise AssertionError("no stand-in may start")
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_only_the_trainers_first_attempt_is_preempted_and_only_when_asked():
    trainer = job(labels={"agrpo-role": "trainer"})
    trainer.move("RUNNING", now=100.0)
    assert not J.due_for_preemption(trainer, 129.0, 30.0) and J.due_for_preemption(trainer, 130.0, 30.0)
    assert not J.due_for_preemption(trainer, 1000.0, None)
    trainer.attempt = 2
    assert not J.due_for_preemption(trainer, 1000.0, 30.0)
    replica = job(labels={"agrpo-role": "replica"})
    replica.move("RUNNING", now=0.0)
    assert not J.due_for_preemption(replica, 1000.0, 30.0)


def test_the_rehearsal_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    root = tmp_path / "rehearsal"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agrpo",
            "+recipe=smoke",
            "launcher=hf_jobs",
            "sync=bucket",
            "inference.replicas=2",
            "inference.device=cpu",
            "--rehearse",
            "launcher.dry_run=true",
            "launcher.hf_jobs.run_id=r1",
            "--rehearsal-dir",
            str(root),
            "--rehearsal-listing-lag-s=2.5",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "rehearse (--rehearse): every Job below runs on this machine" in out and str(root) in out
    assert "listing lag 2.5 s" in out
    assert out.count("ports: 8000 -> http://<vllm-") == 2 and "<rehearsal-gateway-port>" in out
    assert not root.exists()  # a dry run starts no stand-in and writes nothing
