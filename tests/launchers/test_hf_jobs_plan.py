"""The HF Jobs plan (pure): replica and trainer Jobs, the trainer Job's own command, dry run, cost, validation.

No Hub is involved here (plans are plain data); the tests that talk to the Jobs API use a fake Hub server because
the real one cannot be reached from these machines.
"""

import pytest

from agrpo.cli import run
from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems
from agrpo.inference.vllm_server import build_replica_launch
from agrpo.launchers.hf_jobs_plan import PRICE_PER_HOUR_USD, build_jobs_plan, trainer_overrides
from agrpo.launchers.local import build_local_plan

BASE = ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "launcher.hf_jobs.run_id=run1"]


def jobs_cfg(*overrides):
    return compose_run_config([*BASE, *overrides])


def test_two_replica_plan_runs_the_local_vllm_command_on_gpu_images():
    cfg = jobs_cfg("inference.replicas=2")
    plan = build_jobs_plan(cfg, BASE, namespace="alice", replica_ids=["a1", "b2"])
    assert [job.name for job in plan.replicas] == ["run1-vllm-0", "run1-vllm-1"]
    replica = plan.replicas[0]
    cfg.inference.host = "0.0.0.0"
    assert replica.command == build_replica_launch(cfg, 8000, "cuda", None, "python3").argv
    assert replica.command[:3] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert replica.command[replica.command.index("--host") + 1] == "0.0.0.0"
    assert replica.command[replica.command.index("--max-loras") + 1] == "6"  # max_staleness 4 + 2
    assert replica.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1",
                           "VLLM_LOGGING_LEVEL": "INFO"}
    assert (replica.image, replica.flavor, replica.expose, replica.timeout_s) == (
        "vllm/vllm-openai:latest", "h200", [8000], 21600)
    assert replica.volumes == [{"source": "alice/agrpo-runs", "mount_path": "/bucket", "read_only": True}]
    assert replica.labels == {"agrpo-run": "run1", "agrpo-role": "replica"}
    assert [r.url for r in plan.replicas] == ["https://a1--8000.hf.jobs", "https://b2--8000.hf.jobs"]
    trainer = plan.trainer
    assert trainer.volumes[0]["read_only"] is False and trainer.flavor == "h200" and trainer.expose == []
    assert plan.run_dir == "/bucket/run1"


def test_trainer_job_repeats_the_users_command_with_a_role_override_and_the_replica_urls():
    cfg = jobs_cfg("inference.replicas=2", "lora.r=1")
    user = [*BASE, "lora.r=1", "inference.replicas=2", "launcher.dry_run=true", "hydra.run.dir=x", "role=all"]
    plan = build_jobs_plan(cfg, user, namespace="alice", replica_ids=["a1", "b2"], launch_id="L1")
    command = plan.trainer.command
    assert command[:2] == ["bash", "-c"] and command[2] == "pip install --no-cache-dir agrpo && exec \"$@\""
    assert command[3:7] == ["agrpo", "python3", "-m", "agrpo"]
    assert command[7:] == [
        "+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "lora.r=1", "inference.replicas=2",
        "role=trainer", "inference.urls=[https://a1--8000.hf.jobs,https://b2--8000.hf.jobs]",
        "inference.use_proxy=true", "proxy.token_env=HF_TOKEN", "sync.bucket=alice/agrpo-runs",
        "sync.output_dir=/bucket/run1", "hydra.run.dir=/bucket/run1", "launcher.hf_jobs.run_id=run1",
        "launcher.hf_jobs.namespace=alice"]
    assert plan.trainer.env == {"AGRPO_LAUNCH_ID": "L1"}
    assert plan.trainer.secrets == ["HF_TOKEN"]


def test_trainer_command_composes_into_a_valid_trainer_config_with_the_proxy_adding_the_token():
    cfg = jobs_cfg("inference.replicas=2")
    overrides = trainer_overrides(cfg, BASE, "alice", "run1", ["https://a1--8000.hf.jobs", "https://b2--8000.hf.jobs"])
    inside = compose_run_config(overrides)
    assert find_problems(inside) == []
    assert inside.role == "trainer" and inside.sync.output_dir == "/bucket/run1"
    local = build_local_plan(inside, inside.sync.output_dir, [0, 0, 8000], "cuda", 2, python="py")
    assert [s.role for s in local.services] == ["proxy"]  # no replica is started inside the trainer Job
    proxy = local.services[0].argv
    assert [proxy[i + 1] for i, a in enumerate(proxy) if a == "--upstream"] == [
        "https://a1--8000.hf.jobs", "https://b2--8000.hf.jobs"]
    assert proxy[proxy.index("--token-env") + 1] == "HF_TOKEN"
    assert local.trainer.argv[-1] == "2"  # in-flight work scales with the replica count


def test_one_replica_still_goes_through_the_proxy_because_it_adds_the_token():
    cfg = jobs_cfg()
    inside = compose_run_config(trainer_overrides(cfg, BASE, "alice", "run1", ["https://a1--8000.hf.jobs"]))
    local = build_local_plan(inside, "/bucket/run1", [0, 8000], "cuda", 1, python="py")
    assert [s.role for s in local.services] == ["proxy"] and local.vllm_url == "http://127.0.0.1:8000"


def test_requeue_and_labels_and_install_knobs_reach_the_jobs():
    cfg = jobs_cfg("launcher.hf_jobs.trainer_attempts=3", "+launcher.hf_jobs.labels.team=rl",
                   "launcher.hf_jobs.install=", "launcher.hf_jobs.secrets=[HF_TOKEN,WANDB_API_KEY]")
    plan = build_jobs_plan(cfg, BASE, namespace="org")
    assert plan.trainer.attempts == 3
    assert plan.trainer.labels == {"team": "rl", "agrpo-run": "run1", "agrpo-role": "trainer"}
    assert plan.trainer.command[:3] == ["python3", "-m", "agrpo"]  # no install step: the image has agrpo
    assert plan.replicas[0].secrets == ["HF_TOKEN", "WANDB_API_KEY"]
    assert plan.bucket == "org/agrpo-runs"


def test_cost_estimate_sums_every_job_and_names_unknown_flavors():
    plan = build_jobs_plan(jobs_cfg("inference.replicas=2"), BASE)
    assert plan.cost_per_hour() == (3 * PRICE_PER_HOUR_USD["h200"], [])
    bigger = build_jobs_plan(jobs_cfg("launcher.hf_jobs.trainer_flavor=h200x2"), BASE)
    assert bigger.cost_per_hour() == (PRICE_PER_HOUR_USD["h200"] + PRICE_PER_HOUR_USD["h200x2"], [])
    odd = build_jobs_plan(jobs_cfg("launcher.hf_jobs.replica_flavor=future-gpu"), BASE)
    assert odd.cost_per_hour() == (PRICE_PER_HOUR_USD["h200"], ["future-gpu"])
    assert "no price known for ['future-gpu']" in odd.render()


def test_dry_run_prints_every_job_and_the_cost_and_never_a_secret_value(capsys, monkeypatch):
    secret = "hf_DRYRUN_secret_value"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value")
    cfg = jobs_cfg("inference.replicas=2", "launcher.dry_run=true", "launcher.hf_jobs.secrets=[HF_TOKEN,WANDB_API_KEY]")
    assert run(cfg) == {}
    out = capsys.readouterr().out
    assert secret not in out and "wandb_secret_value" not in out
    assert out.startswith("agrpo plan (hf_jobs), run id run1, namespace <namespace>")
    assert "estimated cost: $15.00/hour for 2 replica Job(s) + 1 trainer Job" in out
    for expected in ("[replica] run1-vllm-0", "[replica] run1-vllm-1", "[trainer] run1-trainer",
                     "image: vllm/vllm-openai:latest  flavor: h200 (~$5.00/h)",
                     "secrets: HF_TOKEN WANDB_API_KEY (values never shown)",
                     "volume: bucket <namespace>/agrpo-runs -> /bucket (read-only)",
                     "volume: bucket <namespace>/agrpo-runs -> /bucket (read-write)",
                     "ports: 8000 -> https://<vllm-1-job-id>--8000.hf.jobs",
                     "labels: agrpo-role=replica agrpo-run=run1",
                     "env: VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 VLLM_LOGGING_LEVEL=INFO VLLM_SERVER_DEV_MODE=1",
                     "cmd: python3 -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-0.5B-Instruct"):
        assert expected in out, expected


@pytest.mark.parametrize("overrides, fragment", [
    (["+recipe=smoke", "launcher=hf_jobs"], "launcher=hf_jobs needs sync=bucket"),
    (["+recipe=smoke", "launcher=hf_jobs", "sync=bucket"], "model.builder="),
    ([*BASE, "inference.device=cpu"], "set inference.device=auto or cuda"),
    ([*BASE, "launcher.hf_jobs.run_id='a b'"], "launcher.hf_jobs.run_id='a b' may hold only"),
    ([*BASE, "launcher.hf_jobs.trainer_attempts=0"], "trainer_attempts must be >= 1"),
    ([*BASE, "launcher.hf_jobs.trainer_launcher=slurm"], "trainer_launcher='slurm' must be local or accelerate"),
    ([*BASE, "sync.output_dir=/elsewhere/run1"], "is not under sync.mount_path='/bucket'"),
    ([*BASE, "sync.mount_path=bucket"], "must be an absolute path"),
    ([*BASE, "sync.bucket='a/b/c'"], "must be 'name' or 'namespace/name'"),
    ([*BASE, "role=trainer", "inference.urls=[https://x--8000.hf.jobs]"], "needs launcher.hf_jobs.namespace"),
    ([*BASE, "role=trainer", "inference.urls=[https://x--8000.hf.jobs]", "launcher.hf_jobs.namespace=a",
      "proxy.token_env=HF_TOKEN"], "inference.use_proxy=true"),
])
def test_bad_combinations_name_the_key_to_change(overrides, fragment):
    problems = find_problems(compose_run_config(overrides, output_dir=None))
    assert any(fragment in p for p in problems), problems


def test_the_gsm8k_jobs_config_is_valid():
    assert find_problems(jobs_cfg()) == []
