"""`python -m agrpo ... launcher=hf_jobs` end to end against a fake Hub (the real one cannot be reached from here).

The whole command path runs in a child process: Hydra composition, validation, the namespace lookup, the replica
Jobs, readiness through the exposed URLs, the trainer Job that repeats the user's overrides, log streaming and the
final cancellation.
"""

import os
import subprocess
import sys

from fakes.fake_hub import FAKE_TOKEN, FakeHub


def test_python_m_agrpo_launches_the_run_and_repeats_the_users_overrides_in_the_trainer_job(tmp_path):
    def finishing_trainer(job):
        if job.spec["labels"]["agrpo-role"] == "trainer":
            job.logs, job.stage_after_logs = ["trainer: done, 4 steps"], "COMPLETED"

    with FakeHub(on_create=finishing_trainer) as hub:
        user = ["+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "inference.replicas=2", "lora.r=1",
                "launcher.hf_jobs.run_id=cli1", f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'",
                "launcher.hf_jobs.poll_interval_s=0.01"]
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": FAKE_TOKEN, "HF_HUB_OFFLINE": "0",
               "TRANSFORMERS_OFFLINE": "0", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        done = subprocess.run([sys.executable, "-m", "agrpo", *user, f"hydra.run.dir={tmp_path}"], env=env,
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer: done, 4 steps" in done.stdout
    assert FAKE_TOKEN not in done.stdout + done.stderr
    assert hub.calls("GET", "/api/whoami-v2")  # the namespace came from the token
    replica0, replica1, trainer = hub.created()
    ids = list(hub.jobs)
    assert replica0["command"][replica0["command"].index("--max-lora-rank") + 1] == "1"
    command = trainer["command"]
    assert command[command.index("agrpo", 4) + 1:] == [
        "+recipe=gsm8k", "launcher=hf_jobs", "sync=bucket", "inference.replicas=2", "lora.r=1",
        f"launcher.hf_jobs.replica_url='{hub.replica_url_template()}'", "launcher.hf_jobs.poll_interval_s=0.01",
        "role=trainer",
        f"inference.urls=[{hub.url}/expose/{ids[0]}/8000,{hub.url}/expose/{ids[1]}/8000]",
        "inference.use_proxy=true", "proxy.token_env=HF_TOKEN", "sync.bucket=alice/agrpo-runs",
        "sync.output_dir=/bucket/cli1", "hydra.run.dir=/bucket/cli1", "launcher.hf_jobs.run_id=cli1",
        "launcher.hf_jobs.namespace=alice"]
    assert sorted(hub.cancelled()) == sorted(ids[:2])
