"""Inside the trainer Job: resume from the bucket folder, count attempts, cancel the replicas when it ends.

A local directory stands in for the bucket mount and a fake Hub for the Jobs API (the real Hub cannot be reached
from these machines); the local launcher's executor is replaced by a stub that records what it was given.
"""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from fakes.fake_hub import FakeHub, use_fake_hub

from tests.specs import spec_for
from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.client import make_api
from agrpo.launchers.hf_jobs.trainer import ATTEMPTS_FILE, next_attempt, run_trainer_job


def trainer_cfg(run_dir, *extra):
    return spec_for(
        "+recipe=gsm8k",
        "launcher=hf_jobs",
        "sync=bucket",
        "role=trainer",
        "inference.urls=[https://a--8000.hf.jobs]",
        "inference.use_proxy=true",
        "proxy.token_env=HF_TOKEN",
        "launcher.hf_jobs.run_id=run1",
        "launcher.hf_jobs.namespace=alice",
        f"sync.mount_path={run_dir.parent}",
        f"sync.output_dir={run_dir}",
        *extra,
    )


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


def uploaded_config(tmp_path, launch_id, *overrides):
    """(plan, path) of the trainer Job's config.yaml as the launcher uploads it, for a gsm8k Jobs run of run id run1
    with the bucket mounted at tmp_path."""
    from agrpo.launchers.hf_jobs.planner import build_jobs_plan

    cfg = spec_for(
        "+recipe=gsm8k",
        "launcher=hf_jobs",
        "sync=bucket",
        "launcher.hf_jobs.run_id=run1",
        f"sync.mount_path={tmp_path}",
        *overrides,
    )
    plan = build_jobs_plan(cfg, launch_id=launch_id)
    path = tmp_path / "run1" / "config.yaml"
    write(path, plan.config.text)
    return plan, path


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

    def execute_local(plan):
        seen["plan"] = plan
        return {"reward_last": 0.5}

    def plan_for(cfg):  # the plan is built once the resume state is known: its config.yaml says to resume
        return {"resume": cfg.trainer.resume}

    assert run_trainer_job(cfg, plan_for, execute_local, api=make_api()) == {"reward_last": 0.5}
    assert seen == {"plan": {"resume": "true"}}
    assert not (run_dir / ".vllm_lora" / "trl-policy-v6").exists()
    assert json.loads((run_dir / "checkpoint-4" / "rollout_state.json").read_text())["model_version"] == 6
    assert sorted(hub.cancelled()) == sorted(job.id for job in hub.replicas)
    assert hub.trainer.stage == "RUNNING" and hub.other.stage == "RUNNING"


def test_a_fresh_run_does_not_resume(hub, tmp_path):
    built = []
    run_trainer_job(
        trainer_cfg(tmp_path / "run1"), lambda cfg: built.append(cfg.trainer.resume), lambda plan: {}, api=make_api()
    )
    assert built == ["false"]


def test_a_failed_attempt_keeps_the_replicas_for_the_requeued_trainer_until_the_last(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("AGRPO_LAUNCH_ID", "L1")
    cfg = trainer_cfg(tmp_path / "run1", "launcher.hf_jobs.trainer_attempts=2")

    def preempted(plan):
        raise LaunchError("the trainer exited with code -15")

    with pytest.raises(LaunchError):
        run_trainer_job(cfg, None, preempted, api=make_api())
    assert hub.cancelled() == []  # attempt 1 of 2: the platform will rerun the trainer
    assert json.loads((tmp_path / "run1" / ATTEMPTS_FILE).read_text()) == {"launch_id": "L1", "attempt": 1}
    with pytest.raises(LaunchError):
        run_trainer_job(cfg, None, preempted, api=make_api())
    assert sorted(hub.cancelled()) == sorted(job.id for job in hub.replicas)  # the last attempt cleans up


def test_the_trainer_job_runs_from_the_uploaded_config_and_finds_its_launchs_replicas(hub, tmp_path, monkeypatch):
    """`python -m agrpo.launchers.hf_jobs.trainer CONFIG` as the Job runs it: the uploaded config (from the plan),
    this launch's running replicas found by label, the proxy in front of them adding the token, then cleanup."""
    import agrpo.launchers.base
    from agrpo.launchers.hf_jobs.trainer import main
    from agrpo.launchers.local import LocalLauncher

    run_dir = tmp_path / "run1"
    plan, _ = uploaded_config(
        tmp_path,
        "L7",
        "inference.replicas=2",
        "launcher.hf_jobs.namespace=alice",
        "lora.alpha=5",
        f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
    )
    ours = [hub.add_job(spec.labels) for spec in plan.replicas]
    stale = hub.add_job({**plan.replicas[0].labels, "agrpo-launch": "L6"})  # an earlier launch of the same run
    monkeypatch.setenv("AGRPO_LAUNCH_ID", "L7")
    seen = {}

    class Inner(LocalLauncher):
        def execute(self, plan):
            seen["cfg"], seen["plan"] = OmegaConf.create(plan.files["config.yaml"]), plan  # what the trainer reads
            return {"reward_last": 0.5}

    monkeypatch.setattr(agrpo.launchers.base, "get_launcher", lambda name: Inner())
    assert main([str(run_dir / "config.yaml")]) == 0
    urls = [f"{hub.url}/expose/{job.id}/8000" for job in ours]
    assert list(seen["cfg"].inference.urls) == urls and seen["cfg"].lora.alpha == 5
    proxy = seen["plan"].services[0].argv
    assert [s.role for s in seen["plan"].services] == ["proxy"]  # no replica is started inside the trainer Job
    assert [proxy[i + 1] for i, a in enumerate(proxy) if a == "--upstream"] == urls
    assert proxy[proxy.index("--token-env") + 1] == "HF_TOKEN"
    assert stale.id not in " ".join(proxy)
    assert {job.id for job in hub.replicas + ours + [stale]} <= set(hub.cancelled()) | {stale.id}


def test_the_trainer_job_stops_with_one_line_when_its_replicas_are_gone(hub, tmp_path, monkeypatch, capsys):
    from agrpo.launchers.hf_jobs.trainer import main

    _, config = uploaded_config(tmp_path, "L9", "inference.replicas=2", "launcher.hf_jobs.namespace=alice")
    survivor = hub.add_job({"agrpo-run": "run1", "agrpo-role": "replica", "agrpo-launch": "L9"})
    monkeypatch.setenv("AGRPO_LAUNCH_ID", "L9")
    assert main([str(config)]) == 1
    assert hub.cancelled() == [survivor.id]
    err = capsys.readouterr().err
    assert "found 1 running replica Job(s) of run run1 (launch L9) where inference.replicas=2" in err


def test_python_m_agrpo_refuses_the_trainer_jobs_role():
    from agrpo.errors import ConfigError
    from agrpo.launchers import get_launcher

    with pytest.raises(ConfigError, match="python -m agrpo.launchers.hf_jobs.trainer"):
        get_launcher("hf_jobs").build_plan(trainer_cfg(Path("/bucket/run1")))


def test_a_hub_error_while_finding_the_replicas_is_one_line(hub, tmp_path, monkeypatch, capsys):
    from agrpo.launchers.hf_jobs.trainer import main

    _, config = uploaded_config(tmp_path, "L3", "launcher.hf_jobs.namespace=bob")  # no access to bob
    assert main([str(config)]) == 1
    err = capsys.readouterr().err
    assert "could not list the replica Jobs of run run1 in bob (HfHubHTTPError" in err and "Traceback" not in err


def test_the_plan_is_built_once_the_resume_state_is_known(hub, tmp_path):
    """The plan carries the config.yaml the trainer reads: built before the bucket was inspected, it said
    resume=false, and a requeued trainer restarted at v1 against replicas that still held v1..v5 (rehearsal)."""
    run_dir = tmp_path / "run1"
    write(run_dir / "checkpoint-4" / "trainer_state.json", "{}")
    write(run_dir / "checkpoint-4" / "rollout_state.json", json.dumps({"prompt_index": 8, "model_version": 5}))
    cfg = trainer_cfg(run_dir)
    built = []
    run_trainer_job(
        cfg, lambda cfg: built.append(cfg.trainer.resume) or "plan", lambda plan: {"plan": plan}, api=make_api()
    )
    assert built == ["true"]
