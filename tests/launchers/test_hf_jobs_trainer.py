"""Inside the trainer Job: resume from the bucket folder, count attempts, cancel the replicas when it ends.

A local directory stands in for the bucket mount and a fake Hub for the Jobs API (the real Hub cannot be reached
from these machines); the local launcher's executor is replaced by a stub that records what it was given.
"""

import json

import pytest
from fakes.fake_hub import FakeHub, use_fake_hub

from agrpo.config.compose import compose_run_config
from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs_client import make_api
from agrpo.launchers.hf_jobs_trainer import ATTEMPTS_FILE, next_attempt, run_trainer_job


def trainer_cfg(run_dir, *extra):
    return compose_run_config(["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "role=trainer",
                               "inference.urls=[https://a--8000.hf.jobs]", "inference.use_proxy=true",
                               "proxy.token_env=HF_TOKEN", "launcher.hf_jobs.run_id=run1",
                               "launcher.hf_jobs.namespace=alice", f"sync.mount_path={run_dir.parent}",
                               f"sync.output_dir={run_dir}", *extra])


@pytest.fixture()
def hub(monkeypatch):
    with FakeHub() as fake:
        use_fake_hub(monkeypatch, fake)
        fake.replicas = [fake.add_job({"agrpo-run": "run1", "agrpo-role": "replica"}) for _ in range(2)]
        fake.trainer = fake.add_job({"agrpo-run": "run1", "agrpo-role": "trainer"})
        fake.other = fake.add_job({"agrpo-run": "run2", "agrpo-role": "replica"})
        yield fake


def write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_attempts_count_within_one_launch_and_restart_with_a_new_one():
    assert next_attempt(None, "L1") == {"launch_id": "L1", "attempt": 1}
    assert next_attempt({"launch_id": "L1", "attempt": 1}, "L1") == {"launch_id": "L1", "attempt": 2}
    assert next_attempt({"launch_id": "L1", "attempt": 2}, "L2") == {"launch_id": "L2", "attempt": 1}


def test_success_resumes_from_the_bucket_and_cancels_only_this_runs_replicas(hub, tmp_path):
    run_dir = tmp_path / "run1"
    write(run_dir / "checkpoint-4" / "trainer_state.json", "{}")
    write(run_dir / "checkpoint-4" / "rollout_state.json", json.dumps({"prompt_index": 8, "model_version": 4}))
    write(run_dir / ".vllm_lora" / "trl-policy-v6" / "adapter_config.json")
    cfg = trainer_cfg(run_dir)
    seen = {}

    def execute_local(cfg, plan):
        seen["resume"], seen["plan"] = cfg.trainer.resume, plan
        return {"reward_last": 0.5}

    assert run_trainer_job(cfg, "local-plan", execute_local, api=make_api()) == {"reward_last": 0.5}
    assert seen == {"resume": True, "plan": "local-plan"}
    assert not (run_dir / ".vllm_lora" / "trl-policy-v6").exists()
    assert json.loads((run_dir / "checkpoint-4" / "rollout_state.json").read_text())["model_version"] == 6
    assert sorted(hub.cancelled()) == sorted(job.id for job in hub.replicas)
    assert hub.trainer.stage == "RUNNING" and hub.other.stage == "RUNNING"


def test_a_fresh_run_does_not_resume(hub, tmp_path):
    cfg = trainer_cfg(tmp_path / "run1")
    run_trainer_job(cfg, None, lambda cfg, plan: {"resume": cfg.trainer.resume}, api=make_api())
    assert cfg.trainer.resume is False


def test_a_failed_attempt_keeps_the_replicas_for_the_requeued_trainer_until_the_last(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("AGRPO_LAUNCH_ID", "L1")
    cfg = trainer_cfg(tmp_path / "run1", "launcher.hf_jobs.trainer_attempts=2")

    def preempted(cfg, plan):
        raise LaunchError("the trainer exited with code -15")

    with pytest.raises(LaunchError):
        run_trainer_job(cfg, None, preempted, api=make_api())
    assert hub.cancelled() == []  # attempt 1 of 2: the platform will rerun the trainer
    assert json.loads((tmp_path / "run1" / ATTEMPTS_FILE).read_text()) == {"launch_id": "L1", "attempt": 1}
    with pytest.raises(LaunchError):
        run_trainer_job(cfg, None, preempted, api=make_api())
    assert sorted(hub.cancelled()) == sorted(job.id for job in hub.replicas)  # the last attempt cleans up


def test_inside_the_trainer_job_launcher_hf_jobs_plans_proxy_plus_trainer_and_runs_it(hub, tmp_path):
    from agrpo.launchers import get_launcher

    cfg = trainer_cfg(tmp_path / "run1")
    launcher = get_launcher("hf_jobs")
    plan = launcher.build_plan(cfg)
    assert plan.launcher == "local" and [s.role for s in plan.services] == ["proxy"]
    assert "--token-env" in plan.services[0].argv and "https://a--8000.hf.jobs" in plan.services[0].argv

    class Inner:
        def execute(self, cfg, plan):
            return {"ran": plan.launcher}

    launcher.inner = Inner()
    assert launcher.execute(cfg, plan) == {"ran": "local"}
    assert sorted(hub.cancelled()) == sorted(job.id for job in hub.replicas)
