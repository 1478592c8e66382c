"""The HF Jobs executor against a fake Hub: it submits exactly the plan's Jobs; uploads, readiness, cancellation.

The Hub is faked (tests/fakes/fake_hub.py, a local HTTP server answering huggingface_hub's routes) because these
machines cannot reach it; huggingface_hub's own HfApi makes every call, so the bodies checked here are the ones the
real Jobs API would receive.
"""

import io
import json
import shlex
import zipfile
from pathlib import Path

import pytest
from fakes.fake_hub import FAKE_TOKEN, FakeHub, trainer_completes, use_fake_hub
from hub_lines import EXPOSE_8000_BODY, PRIVATE_BUCKET_BODY, needs_run_job_attempts
from omegaconf import OmegaConf

from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.executor import JobsRun
from agrpo.launchers.hf_jobs.planner import GPU_EXTRAS, build_jobs_plan
from agrpo.launchers.plan import SAFE_ENV_VALUES
from tests.specs import spec_for

USER = [
    "+recipe=gsm8k",
    "launcher=hf_jobs",
    "sync=bucket",
    "inference.replicas=2",
    "launcher.hf_jobs.run_id=run1",
    "launcher.hf_jobs.namespace=alice",
]
REPO = Path(__file__).resolve().parents[2]
PINNED = "launcher.hf_jobs.install='agrpo==0.1.0'"  # most tests skip the wheel build; one builds it for real


def make_plan(hub, *extra):
    cfg = spec_for(
        *USER,
        "launcher.hf_jobs.poll_interval_s=0.01",
        "launcher.hf_jobs.ready_timeout_s=1",
        f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
        *extra,
    )
    return build_jobs_plan(cfg, launch_id="L1")


def launch(hub, monkeypatch, *extra, plan=None):
    """Run the executor on the fake Hub; return (summary or error, lines echoed)."""
    use_fake_hub(monkeypatch, hub)
    plan = plan or make_plan(hub, PINNED, *extra)
    printed = []
    run = JobsRun(plan, make_api(), echo=printed.append)
    try:
        return run.execute(), printed
    except LaunchError as error:
        return error, printed


finishing_trainer = trainer_completes("step 1 reward 0.1", "step 2 reward 0.3")


def test_golden_job_creation_bodies_for_a_two_replica_run(monkeypatch):
    with FakeHub(on_create=finishing_trainer) as hub:
        summary, printed = launch(hub, monkeypatch)
    assert [r.body for r in hub.calls("POST", "/api/buckets/") if r.body] == [PRIVATE_BUCKET_BODY]
    assert hub.calls("POST", "/api/buckets/")[0].path == "/api/buckets/alice/agrpo-runs"
    replica0, replica1, trainer = hub.created()
    ids = list(hub.jobs)
    assert replica0 == {
        "command": [
            "vllm",
            "serve",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "1024",
            "--enable-lora",
            "--max-lora-rank",
            "8",
            "--max-loras",
            "6",
            "--logprobs-mode",
            "processed_logprobs",
            "--seed",
            "42",
            "--gpu-memory-utilization",
            "0.85",
        ],
        "arguments": [],
        "environment": {
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
        },
        "flavor": "h200",
        "secrets": {"HF_TOKEN": FAKE_TOKEN},
        "timeoutSeconds": 21600,
        "labels": {"agrpo-run": "run1", "agrpo-role": "replica", "agrpo-launch": "L1", "name": "run1-vllm-0"},
        "volumes": [{"type": "bucket", "source": "alice/agrpo-runs", "mountPath": "/bucket", "readOnly": True}],
        "expose": EXPOSE_8000_BODY,
        "dockerImage": "vllm/vllm-openai:v0.31.0",
    }
    assert replica1["labels"]["name"] == "run1-vllm-1" and replica1["command"] == replica0["command"]
    assert trainer["command"][3:] == [
        "agrpo-install",
        "agrpo==0.1.0",
        GPU_EXTRAS,
        "--",
        "python3",
        "-m",
        "agrpo.launchers.hf_jobs.trainer",
        "/bucket/run1/config.yaml",
    ]
    assert {k: v for k, v in trainer.items() if k != "command"} == {
        "arguments": [],
        "environment": {"AGRPO_LAUNCH_ID": "L1"},
        "flavor": "h200",
        "secrets": {"HF_TOKEN": FAKE_TOKEN},
        "timeoutSeconds": 21600,
        "labels": {"agrpo-run": "run1", "agrpo-role": "trainer", "agrpo-launch": "L1", "name": "run1-trainer"},
        "volumes": [{"type": "bucket", "source": "alice/agrpo-runs", "mountPath": "/bucket", "readOnly": False}],
        "dockerImage": "vllm/vllm-openai:v0.31.0",
    }
    # The run config went to the run's folder before any Job was created.
    uploaded = hub.uploads["alice/agrpo-runs"]
    assert list(uploaded) == ["run1/config.yaml"]
    assert OmegaConf.create(uploaded["run1/config.yaml"].decode()).role == "trainer"
    first_job = next(i for i, r in enumerate(hub.requests) if r.path == "/api/jobs/alice" and r.method == "POST")
    assert max(i for i, r in enumerate(hub.requests) if r.method == "PUT") < first_job
    # The token travels only as a Job secret and as the Authorization header, never in a command or env.
    for body in hub.created():
        assert FAKE_TOKEN not in json.dumps({k: v for k, v in body.items() if k != "secrets"})
    health = [r for r in hub.requests if r.path.endswith("/health")]
    assert health and all(r.headers["Authorization"] == f"Bearer {FAKE_TOKEN}" for r in health)
    # End of run: the trainer's logs were streamed, then both replicas were cancelled.
    assert printed == ["step 1 reward 0.1", "step 2 reward 0.3"]
    assert sorted(hub.cancelled()) == sorted(ids[:2])
    assert [hub.jobs[i].stage for i in ids] == ["CANCELED", "CANCELED", "COMPLETED"]
    assert summary == {
        "run_id": "run1",
        "namespace": "alice",
        "trainer_job": ids[2],
        "replica_jobs": ids[:2],
        "run_dir": "/bucket/run1",
    }


def test_an_existing_bucket_is_reused(monkeypatch):
    with FakeHub(on_create=finishing_trainer) as hub:
        hub.buckets["alice/agrpo-runs"] = None  # the Hub answers 409: create_bucket(exist_ok=True) accepts it
        summary, _ = launch(hub, monkeypatch)
    assert summary["run_id"] == "run1" and len(hub.created()) == 3


def test_a_replica_that_never_gets_healthy_cancels_everything_and_says_which(monkeypatch):
    def second_is_sick(job):
        if job.spec["labels"].get("name") == "run1-vllm-1":
            job.healthy = False
            job.logs = ["CUDA out of memory"]

    with FakeHub(on_create=second_is_sick) as hub:
        error, _ = launch(hub, monkeypatch)
    ids = list(hub.jobs)
    assert isinstance(error, LaunchError)
    message = str(error)
    assert (
        f"replica run1-vllm-1 (Job {ids[1]}) was not healthy after 1 s (last: stage RUNNING, /health HTTP 503)"
        in message
    )
    assert "Every Job of run run1 was cancelled" in message and "CUDA out of memory" in message
    assert len(hub.created()) == 2  # no trainer was launched
    assert sorted(hub.cancelled()) == sorted(ids)
    assert FAKE_TOKEN not in message


def test_a_replica_whose_job_errors_cancels_everything_with_its_status_message(monkeypatch):
    def first_fails(job):
        if job.spec["labels"].get("name") == "run1-vllm-0":
            job.stage, job.message = "ERROR", "image pull failed"

    with FakeHub(on_create=first_fails) as hub:
        error, _ = launch(hub, monkeypatch, "launcher.hf_jobs.ready_timeout_s=30")
    ids = list(hub.jobs)
    assert str(error).startswith(
        f"replica run1-vllm-0 (Job {ids[0]}) ended with stage ERROR before it was healthy: "
        "image pull failed. Every Job of run run1 was cancelled"
    )
    assert hub.cancelled() == [ids[1]]  # the errored one is already over
    assert len(hub.created()) == 2


def test_a_failed_trainer_cancels_the_replicas_and_says_how_to_resume(monkeypatch):
    def trainer_fails(job):
        if job.spec["labels"]["agrpo-role"] == "trainer":
            job.logs, job.stage_after_logs, job.message = ["Traceback ..."], "ERROR", "exit code 1"

    with FakeHub(on_create=trainer_fails) as hub:
        error, printed = launch(hub, monkeypatch)
    ids = list(hub.jobs)
    assert str(error) == (
        f"the trainer Job {ids[2]} ended with stage ERROR: exit code 1. Its checkpoints stay in "
        "the bucket alice/agrpo-runs under /bucket/run1; relaunch with "
        "launcher.hf_jobs.run_id=run1 to resume"
    )
    assert printed == ["Traceback ..."]
    assert sorted(hub.cancelled()) == sorted(ids[:2])


def preempted_trainer(trainers: list):
    """An `on_create` for the fake Hub: the trainer Job logs one line and ends in ERROR; it is appended to `trainers`."""

    def on_create(job):
        if job.spec["labels"]["agrpo-role"] == "trainer":
            job.logs, job.stage_after_logs = ["attempt 1 preempted"], "ERROR"
            trainers.append(job)

    return on_create


def requeue(job) -> None:
    """What the platform does to a preempted Job: back to RUNNING, one more line, then it completes."""
    job.logs, job.stage_after_logs = [*job.logs, "attempt 2 done"], "COMPLETED"
    job.stage = "RUNNING"


@needs_run_job_attempts
def test_a_requeued_trainer_is_followed_until_its_last_attempt(monkeypatch):
    attempts = []

    with FakeHub(on_create=preempted_trainer(attempts)) as hub:
        import threading

        def platform_requeues():
            while not attempts or attempts[0].stage != "ERROR":
                threading.Event().wait(0.01)
            requeue(attempts[0])

        thread = threading.Thread(target=platform_requeues, daemon=True)
        thread.start()
        summary, printed = launch(
            hub, monkeypatch, "launcher.hf_jobs.trainer_attempts=2", "launcher.hf_jobs.requeue_grace_s=30"
        )
        thread.join(5)
    assert printed == ["attempt 1 preempted", "attempt 2 done"]
    assert summary["trainer_job"] == list(hub.jobs)[2]
    assert hub.created()[2]["attempts"] == 2


def test_a_trainer_running_again_when_its_stream_ended_is_followed_again(monkeypatch):
    """The trainer's stream ends with the Job in ERROR (preempted), and when the executor looks the platform has
    already requeued it (RUNNING). The executor used to poll the stage alone, for ever here (the fake Hub moves a
    Job on only while its logs are streamed) and silently on the Hub; it follows the logs again. Run in a thread so
    the old behaviour fails here instead of hanging."""
    import threading

    trainers = []

    with FakeHub(on_create=preempted_trainer(trainers)) as hub:
        use_fake_hub(monkeypatch, hub)
        run = JobsRun(make_plan(hub, PINNED), make_api(), echo=(printed := []).append)
        inspect = run.api.inspect_job

        def requeued_before_the_first_look(**kwargs):
            job = trainers[0] if trainers else None
            if job is not None and job.stage == "ERROR" and len(job.logs) == 1:  # the race, made certain
                requeue(job)
            return inspect(**kwargs)

        monkeypatch.setattr(run.api, "inspect_job", requeued_before_the_first_look)
        result = {}
        runner = threading.Thread(target=lambda: result.update(summary=run.execute()), daemon=True)
        runner.start()
        runner.join(60)
        assert not runner.is_alive(), "the executor never followed the requeued trainer's logs"
    assert printed == ["attempt 1 preempted", "attempt 2 done"]
    assert result["summary"]["trainer_job"] == list(hub.jobs)[2]


def test_detach_returns_once_the_trainer_runs_and_cancels_nothing(monkeypatch):
    with FakeHub() as hub:
        summary, printed = launch(hub, monkeypatch, "launcher.hf_jobs.detach=true")
    assert len(hub.created()) == 3 and hub.cancelled() == []
    assert "agrpo jobs cancel run1" in printed[0]
    assert summary["trainer_job"] == list(hub.jobs)[2]


def test_ctrl_c_while_waiting_cancels_every_job_launched(monkeypatch):
    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        run = JobsRun(make_plan(hub, PINNED), make_api(), echo=lambda line: None)

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(run, "wait_ready", interrupted)
        with pytest.raises(LaunchError, match="interrupted; every Job of run run1 was cancelled"):
            run.execute()
    assert sorted(hub.cancelled()) == sorted(hub.jobs)


def test_a_missing_secret_stops_the_launch_before_any_job_exists(monkeypatch):
    with FakeHub() as hub:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        error, _ = launch(hub, monkeypatch, "launcher.hf_jobs.secrets=[HF_TOKEN,WANDB_API_KEY]")
    assert "no value for the Job secret(s) ['WANDB_API_KEY']" in str(error)
    assert hub.created() == []


def rendered_lines_of(body: dict) -> list[str]:
    """What the dry run prints for a Job with this creation body (every field the executor submits)."""
    labels = {k: v for k, v in body["labels"].items() if k != "name"}
    lines = [
        f"[{labels['agrpo-role']}] {body['labels']['name']}",
        f"  image: {body['dockerImage']}  flavor: {body['flavor']} (~$5.00/h)",
        f"  cmd: {shlex.join(body['command'])}",
        f"  secrets: {' '.join(body['secrets'])} (values never shown)",
        f"  labels: {' '.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
    ]
    timeout = f"  timeout: {body['timeoutSeconds']} s"
    lines.append(timeout + (f"  attempts: {body['attempts']}" if body.get("attempts") else ""))
    for volume in body["volumes"]:
        mode = "read-only" if volume["readOnly"] else "read-write"
        lines.append(f"  volume: bucket {volume['source']} -> {volume['mountPath']} ({mode})")
    if body.get("expose"):
        lines.append(f"  ports: {', '.join(map(str, body['expose']['ports']))} -> ")
    shown = SAFE_ENV_VALUES | {"AGRPO_LAUNCH_ID"}  # any other env value (none here) would print as <set>
    env = sorted(body["environment"].items())
    lines.append("  env: " + " ".join(f"{k}={v if k in shown else '<set>'}" for k, v in env))
    return lines


@needs_run_job_attempts
def test_the_executor_submits_exactly_the_jobs_the_dry_run_printed_and_uploads_the_wheel_it_names(monkeypatch):
    """The plan is rendered (the dry run), then executed as is: every Job body matches the printed Job, field by
    field, and the wheel uploaded is the file the trainer's command installs (built for real with pip)."""
    with FakeHub(on_create=finishing_trainer) as hub:
        plan = make_plan(hub, "launcher.hf_jobs.trainer_attempts=2")
        dry_run = plan.render()
        tree_before = sorted(p.name for p in REPO.iterdir())
        summary, _ = launch(hub, monkeypatch, plan=plan)
        assert summary["run_id"] == "run1", summary
        created = hub.created()
        assert len(created) == len(plan.jobs()) == 3
        blocks = dry_run.split("\n[")
        for body, spec in zip(created, plan.jobs()):
            block = next("[" + b for b in blocks if b.startswith(f"{spec.role}] {spec.name}\n"))
            for line in rendered_lines_of(body):
                assert any(printed.startswith(line.rstrip()) for printed in block.splitlines()), (line, block)
            assert (body["command"], body["environment"], body["dockerImage"], body["flavor"]) == (
                spec.command,
                spec.env,
                spec.image,
                spec.flavor,
            )
            assert sorted(body["secrets"]) == sorted(spec.secrets)
            assert {k: v for k, v in body["labels"].items() if k != "name"} == spec.labels
        uploaded = hub.uploads["alice/agrpo-runs"]
        assert sorted(uploaded) == sorted([plan.wheel.path_in_bucket, plan.config.path_in_bucket])
        assert uploaded[plan.config.path_in_bucket].decode() == plan.config.text
        wheel = zipfile.ZipFile(io.BytesIO(uploaded[plan.wheel.path_in_bucket]))  # the wheel pip built
        assert "agrpo/launchers/hf_jobs/executor.py" in wheel.namelist()
        executor = "agrpo/launchers/hf_jobs/executor.py"
        assert wheel.read(executor) == (REPO / executor).read_bytes()  # the code that launched the run
        assert f"/bucket/{plan.wheel.path_in_bucket}" in created[2]["command"]
        assert "prepare: " in dry_run and plan.wheel.filename in dry_run
        assert sorted(p.name for p in REPO.iterdir()) == tree_before  # built from a copy: no build/, no egg-info


def test_no_secret_value_reaches_a_job_body_the_config_or_the_logs(monkeypatch, caplog):
    caplog.set_level("DEBUG")
    with FakeHub(on_create=finishing_trainer) as hub:
        monkeypatch.setenv("WANDB_API_KEY", "wandb_value_never_shown")
        summary, printed = launch(hub, monkeypatch, "launcher.hf_jobs.secrets=[HF_TOKEN,WANDB_API_KEY]")
    assert summary["run_id"] == "run1"
    for body in hub.created():
        assert body["secrets"] == {"HF_TOKEN": FAKE_TOKEN, "WANDB_API_KEY": "wandb_value_never_shown"}
        rest = json.dumps({k: v for k, v in body.items() if k != "secrets"})
        assert FAKE_TOKEN not in rest and "wandb_value_never_shown" not in rest
    for files in hub.uploads.values():
        for data in files.values():
            assert FAKE_TOKEN.encode() not in data and b"wandb_value_never_shown" not in data
    assert FAKE_TOKEN not in caplog.text + "\n".join(printed)
