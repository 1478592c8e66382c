"""The dry run of a Jobs launch shows what the trainer Job starts inside (agrpo's proxy, then the trainer), and that
is what the trainer Job's own plan starts once it has found its replicas. The Jobs API is a fake (the Hub cannot be
reached from these machines); the in-Job launcher and its plan are the real ones, only the executor records. Both
name the Job's port and secrets (placeholders): the Job makes them when it runs its plan."""

from __future__ import annotations

from fakes.fake_hub import FakeHub, use_fake_hub

from agrpo.launchers.hf_jobs.planner import build_jobs_plan
from tests.specs import spec_for


def jobs_plan(tmp_path, *overrides, replica_url=None):
    extra = [f"launcher.hf_jobs.replica_url='{replica_url}'"] if replica_url else []
    cfg = spec_for(
        "+recipe=gsm8k",
        "launcher=hf_jobs",
        "sync=bucket",
        "launcher.hf_jobs.run_id=run1",
        "launcher.hf_jobs.namespace=alice",
        "inference.replicas=2",
        f"sync.mount_path={tmp_path}",
        *extra,
        *overrides,
    )
    return build_jobs_plan(cfg, launch_id="L5")


def test_the_dry_run_shows_the_trainer_jobs_processes(tmp_path):
    plan = jobs_plan(tmp_path, "proxy.block_size=32")
    assert [spec.role for spec in plan.in_job] == ["proxy", "trainer"]
    proxy, trainer = plan.in_job
    upstreams = [proxy.argv[i + 1] for i, a in enumerate(proxy.argv) if a == "--upstream"]
    assert upstreams == [f"https://<vllm-{i}-job-id>--8000.hf.jobs" for i in range(2)]
    assert proxy.argv[proxy.argv.index("--token-env") + 1] == "HF_TOKEN"  # the proxy adds the token upstream
    assert proxy.argv[proxy.argv.index("--block-size") + 1] == "32"  # the user's proxy knobs reach it
    assert trainer.argv[1:4] == ["-m", "agrpo.trainer", f"{tmp_path}/run1/config.yaml"]
    printed = plan.render()
    assert "inside the trainer Job (its own ports, GPUs and threads, chosen there):" in printed
    assert "  [proxy] proxy\n    cmd: python3 -m agrpo.proxy" in printed and "  [trainer] trainer\n" in printed
    assert "agrpo.proxy --port <port:proxy>" in printed and "--vllm-url http://127.0.0.1:<port:proxy>" in printed
    accelerate = jobs_plan(tmp_path, "launcher.hf_jobs.trainer_launcher=accelerate")
    assert "accelerate launch" in accelerate.in_job[-1].name


def test_the_trainer_job_starts_the_processes_the_dry_run_showed(tmp_path, monkeypatch):
    import agrpo.launchers.base
    from agrpo.launchers.hf_jobs.trainer import main
    from agrpo.launchers.local import LocalLauncher

    with FakeHub() as hub:
        use_fake_hub(monkeypatch, hub)
        plan = jobs_plan(tmp_path, "proxy.block_size=32", replica_url=hub.replica_url_template())
        (tmp_path / "run1").mkdir()
        (tmp_path / "run1" / "config.yaml").write_text(plan.config.text)
        ours = [hub.add_job(spec.labels) for spec in plan.replicas]
        monkeypatch.setenv("AGRPO_LAUNCH_ID", "L5")
        seen = {}

        class Inner(LocalLauncher):
            def execute(self, local_plan):
                seen["plan"] = local_plan
                return {}

        monkeypatch.setattr(agrpo.launchers.base, "get_launcher", lambda name: Inner())
        assert main([str(tmp_path / "run1" / "config.yaml")]) == 0

    started = [*seen["plan"].services, seen["plan"].trainer]

    def shown(argv, urls):
        """argv with this launch's URLs as the dry run names them and the interpreter masked (the Job's
        launcher.hf_jobs.python, which runs the in-Job launcher, is its children's too). The ports are the same
        placeholders in both: the Job reserves them when it runs its plan."""
        return ["<python>"] + [next((f"<url {i}>" for i, u in enumerate(urls) if u == a), a) for a in argv[1:]]

    real = [f"{hub.url}/expose/{job.id}/8000" for job in ours]
    pattern = [hub.replica_url_template().format(job_id=f"<vllm-{i}-job-id>", port=8000) for i in range(2)]
    assert [(s.role, s.name) for s in started] == [(s.role, s.name) for s in plan.in_job]
    for job_spec, dry_spec in zip(started, plan.in_job):
        assert shown(job_spec.argv, real) == shown(dry_spec.argv, pattern)
