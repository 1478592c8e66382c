"""agrpo/sweep_fleet.py: the argv rewrite that runs a shared-fleet sweep's points at once (pure), and the callback that
starts the sweep's fleet and always stops it (real processes: a stand-in for `agrpo fleet up`, see FAKE_FLEET)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from agrpo import sweep_fleet
from agrpo.processes.private_dir import RUNTIME_ENV
from tests.processes import wait_for
from agrpo.sweep_fleet import FLEET_NOTE, SharedFleetSweep, fleet_overrides, joblib_args, point_count, ready_url

SWEEP = ["agrpo", "-m", "+recipe=smoke", "lora.r=1,4,8,16", "inference.shared_fleet=sweep"]


def test_a_shared_fleet_multirun_gets_the_joblib_launcher_one_job_per_point():
    assert joblib_args(SWEEP, max_tenants=4) == [*SWEEP, "hydra/launcher=joblib", "hydra.launcher.n_jobs=4"]
    two = ["agrpo", "--multirun", "+recipe=smoke", "lora.r=1,4", "trainer.max_steps=5", "inference.shared_fleet=x"]
    assert joblib_args(two, max_tenants=4)[-1] == "hydra.launcher.n_jobs=2"


def test_n_jobs_is_capped_at_the_fleets_tenants_and_counts_the_product_of_the_lists():
    argv = ["agrpo", "-m", "lora.r=1,4,8,16", "trainer.learning_rate=1e-3,1e-2", "inference.shared_fleet=sweep"]
    assert point_count(argv[2:]) == 8
    assert joblib_args(argv, max_tenants=4)[-1] == "hydra.launcher.n_jobs=4"
    assert joblib_args(argv, max_tenants=16)[-1] == "hydra.launcher.n_jobs=8"
    assert point_count(["lora.r=range(1,4)", "x=1"]) == 3
    assert point_count(["+recipe=smoke_optuna", "hydra.sweeper.n_jobs=4"]) is None  # the recipe's sweeper decides


def test_an_optuna_style_sweep_it_cannot_count_gets_the_tenant_cap():
    argv = ["agrpo", "-m", "+recipe=smoke_optuna", "lora.r=interval(1,8)", "inference.shared_fleet=sweep"]
    assert point_count(argv[2:]) is None
    assert joblib_args(argv, max_tenants=3)[-2:] == ["hydra/launcher=joblib", "hydra.launcher.n_jobs=3"]


@pytest.mark.parametrize(
    "argv",
    [
        ["agrpo", "+recipe=smoke", "inference.shared_fleet=sweep"],  # one run, no multirun
        ["agrpo", "-m", "+recipe=smoke", "lora.r=1,4"],  # a sweep with its own fleets, as before
        [*SWEEP, "hydra/launcher=basic"],  # the user's own launcher choice stands
        ["agrpo", "-m", "lora.r=1,4", "inference.shared_fleet=a,b"],  # a swept fleet name: not one fleet
        ["agrpo", "-m", "lora.r=1,4", "inference.shared_fleet=sweep", "bad=["],  # Hydra will refuse it itself
    ],
)
def test_argv_is_left_alone_outside_a_shared_fleet_multirun(argv):
    assert joblib_args(argv, max_tenants=4) == argv


def test_the_users_n_jobs_stands():
    argv = [*SWEEP, "hydra.launcher.n_jobs=2"]
    assert joblib_args(argv, max_tenants=4) == [*argv, "hydra/launcher=joblib"]


def test_fleet_up_gets_the_unswept_overrides_and_the_largest_swept_rank_and_staleness():
    task = [
        "+recipe=smoke",
        "lora.r=1,4,8,16",
        "inference.shared_fleet=sweep",
        "trainer.learning_rate=1e-3,1e-2",
        "trainer.max_staleness=1,2",
        "trainer.max_steps=5",
    ]
    assert fleet_overrides(task) == ["+recipe=smoke", "lora.r=16", "trainer.max_staleness=2", "trainer.max_steps=5"]


def test_the_ready_line_is_the_named_fleets_only():
    text = "booting\nfleet other ready at http://127.0.0.1:1\nfleet sweep ready at http://127.0.0.1:8300\n"
    assert ready_url(text, "sweep") == "http://127.0.0.1:8300"
    assert ready_url(text, "nope") is None
    assert ready_url("fleet sweep ready at", "sweep") is None


# A stand-in for `agrpo fleet up NAME ...` (the real one boots vLLM replicas; tests/fleet and the e2e runs cover it):
# it prints a few lines and the ready line, then waits for SIGTERM, and notes in a file that it was stopped by it.
FAKE_FLEET = """
import os, signal, sys, time, pathlib
name, marker = sys.argv[1], pathlib.Path(sys.argv[-1].split("=", 1)[1])
def stop(*_):
    marker.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("starting replicas for", " ".join(sys.argv[2:]), flush=True)
print("stop after runs:", os.environ.get("AGRPO_FLEET_STOP_AFTER_RUNS"), flush=True)
if "fail" in name:
    sys.exit(3)
print(f"fleet {name} ready at http://127.0.0.1:9", flush=True)
while True:
    time.sleep(0.1)
"""


def _config(sweep_dir: Path, name: str, marker: Path):
    task = ["+recipe=smoke", "lora.r=1,4", f"inference.shared_fleet={name}", f"marker={marker}"]
    return OmegaConf.create(
        {"hydra": {"overrides": {"task": task}, "sweep": {"dir": str(sweep_dir)}}, "inference": {"shared_fleet": name}}
    )


@pytest.fixture
def fake_fleet(tmp_path, monkeypatch):
    script = tmp_path / "fake_fleet_up.py"
    script.write_text(FAKE_FLEET)
    monkeypatch.setattr(sweep_fleet, "running_fleet", lambda name: None)  # no fleet of that name is up
    return [sys.executable, str(script)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_callback_starts_the_fleet_waits_for_ready_and_stops_it_at_the_end(tmp_path, fake_fleet):
    marker = tmp_path / "stopped"
    callback = SharedFleetSweep(command=fake_fleet, stop_timeout_s=10)
    callback.on_multirun_start(_config(tmp_path / "sweep", "sweep", marker))
    pid = callback.fleet.pid
    assert _alive(pid) and os.getpgid(pid) == pid  # its own process group
    log = (tmp_path / "sweep" / "fleet_sweep.log").read_text()
    assert f"starting replicas for +recipe=smoke lora.r=4 marker={marker}" in log  # not swept; the largest rank
    assert "stop after runs: 2" in log  # the sweep's 2 points: it stops itself once both left (fleet_up.py)
    assert '"started_by_sweep": true' in (tmp_path / "sweep" / FLEET_NOTE).read_text()
    copy = pickle.loads(pickle.dumps(callback))  # what Hydra hands each joblib worker
    assert copy.fleet is None and callback.fleet is not None
    callback.on_multirun_end(_config(tmp_path / "sweep", "sweep", marker))
    assert marker.read_text() == "SIGTERM" and not _alive(pid)
    callback.stop()  # again (atexit after a normal end): nothing to do


def test_a_fleet_that_dies_before_ready_ends_the_sweep_with_its_log(tmp_path, fake_fleet, capsys):
    callback = SharedFleetSweep(command=fake_fleet)
    with pytest.raises(SystemExit) as exit_info:
        callback.on_multirun_start(_config(tmp_path / "sweep", "failing", tmp_path / "m"))
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "fleet failing exited with code 3 before it was ready" in err and "starting replicas for" in err
    assert callback.fleet is None


def test_a_fleet_already_up_is_used_and_left_running(tmp_path, fake_fleet, monkeypatch, capsys):
    up = SimpleNamespace(url="http://127.0.0.1:8300", run_dir=str(tmp_path / "fleet_run"), max_tenants=4)
    monkeypatch.setattr(sweep_fleet, "running_fleet", lambda name: up if name == "sweep" else None)
    callback = SharedFleetSweep(command=fake_fleet)
    callback.on_multirun_start(_config(tmp_path / "sweep", "sweep", tmp_path / "m"))
    assert callback.fleet is None and not (tmp_path / "sweep" / "fleet_sweep.log").exists()
    assert "already up: it stays up after" in capsys.readouterr().out
    assert '"started_by_sweep": false' in (tmp_path / "sweep" / FLEET_NOTE).read_text()
    callback.on_multirun_end(_config(tmp_path / "sweep", "sweep", tmp_path / "m"))


def test_a_sweep_without_a_shared_fleet_starts_nothing(tmp_path, fake_fleet):
    config = OmegaConf.create(
        {"hydra": {"overrides": {"task": ["lora.r=1,4"]}, "sweep": {"dir": str(tmp_path)}}, "inference": {}}
    )
    callback = SharedFleetSweep(command=fake_fleet)
    callback.on_multirun_start(config)
    assert callback.fleet is None and not (tmp_path / FLEET_NOTE).exists()


def test_a_stopped_fleet_is_killed_when_it_ignores_sigterm(tmp_path, monkeypatch):
    script = tmp_path / "stubborn.py"
    script.write_text(
        FAKE_FLEET.replace("signal.signal(signal.SIGTERM, stop)", "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    )
    monkeypatch.setattr(sweep_fleet, "running_fleet", lambda name: None)
    callback = SharedFleetSweep(command=[sys.executable, str(script)], stop_timeout_s=1)
    callback.on_multirun_start(_config(tmp_path / "sweep", "sweep", tmp_path / "m"))
    pid = callback.fleet.pid
    callback.stop()
    assert not _alive(pid)
    assert not (tmp_path / "m").exists()  # it never ran its SIGTERM handler: SIGKILL after stop_timeout_s


def test_the_cli_caps_n_jobs_at_the_running_fleets_tenants_else_the_command_line_else_the_default(
    monkeypatch, tmp_path
):
    from agrpo.config.schema.inference import SharedFleetConfig
    from agrpo.fleet.registry import write_fleet
    from agrpo.processes.private_dir import RUNTIME_ENV
    from agrpo.sweep_fleet import concurrent_argv
    from tests.fleet.test_registry import a_record

    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))  # this test's own fleet registry
    eight = ["agrpo", "-m", "lora.r=1,2,4,8,16,32,64,128", "inference.shared_fleet=sweep"]
    assert concurrent_argv(eight)[-1] == f"hydra.launcher.n_jobs={SharedFleetConfig().max_tenants}"
    assert concurrent_argv([*eight, "inference.shared.max_tenants=2"])[-1] == "hydra.launcher.n_jobs=2"
    write_fleet(a_record("sweep", max_tenants=3))  # a fleet of that name runs (this process stands for it)
    assert concurrent_argv([*eight, "inference.shared.max_tenants=2"])[-1] == "hydra.launcher.n_jobs=3"
    assert concurrent_argv(["agrpo", "lora.r=1", "inference.shared_fleet=sweep"]) == [
        "agrpo", "lora.r=1", "inference.shared_fleet=sweep"
    ]  # fmt: skip


def test_a_dry_run_sweep_says_which_fleet_it_would_start_and_starts_none(tmp_path, fake_fleet, capsys, monkeypatch):
    from agrpo.launchers.shared_fleet import SWEEP_STARTS_FLEET_ENV

    monkeypatch.delenv(SWEEP_STARTS_FLEET_ENV, raising=False)
    config = _config(tmp_path / "sweep", "sweep", tmp_path / "m")
    config.launcher = {"dry_run": True}
    config.hydra.overrides.task.append("launcher.dry_run=true")
    callback = SharedFleetSweep(command=fake_fleet)
    callback.on_multirun_start(config)
    assert callback.fleet is None and not (tmp_path / "sweep").exists()
    out = capsys.readouterr().out
    assert "the sweep would start fleet sweep with: agrpo fleet up sweep +recipe=smoke lora.r=4" in out
    assert "launcher.dry_run" not in out  # the command it would run, not the dry run's own flag
    assert os.environ[SWEEP_STARTS_FLEET_ENV] == "sweep"  # its points plan without the fleet's record


# A stand-in for `agrpo fleet up` that never gets ready (the real one would be booting its replicas): the sweep is
# still in its start when the test stops it.
BOOTING_FLEET = """
import signal, sys, time, pathlib
marker = pathlib.Path(sys.argv[1])
def stop(*_):
    marker.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("starting replicas", flush=True)
while True:
    time.sleep(0.1)
"""


def _sweep_waiting_for_its_fleet(tmp_path: Path) -> tuple[subprocess.Popen, Path, int]:
    """The real CLI, a 2-point sweep on fleet `booting`, started with the stand-in; returns once the stand-in runs:
    (the sweep's process, the marker the stand-in writes on SIGTERM, the stand-in's pid)."""
    script, marker = tmp_path / "booting_fleet.py", tmp_path / "stopped"
    script.write_text(BOOTING_FLEET)
    command = f"+hydra.callbacks.shared_fleet.command=[{sys.executable},{script},{marker}]"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "agrpo", "-m", "+recipe=smoke", "lora.r=1,4", "inference.shared_fleet=booting", command,
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", RUNTIME_ENV: str(tmp_path / "rt")},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = tmp_path / "sweep" / "fleet_booting.log"
    wait_for(lambda: log.is_file() and "starting replicas" in log.read_text(), timeout_s=120, what="the stand-in")
    pids = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and _cmdline(int(p)).startswith(f"{sys.executable} {script} ")
    ]
    assert len(pids) == 1
    return sweep, marker, pids[0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_the_fleet_boots_stops_the_fleet(tmp_path, stop_signal):
    sweep, marker, fleet_pid = _sweep_waiting_for_its_fleet(tmp_path)
    sweep.send_signal(stop_signal)  # noted, acted on at the wait loop's next look (agrpo.sweep_fleet.NotedSignals)
    assert sweep.wait(timeout=120) == 130
    err = sweep.stderr.read()
    assert "interrupted while fleet booting started" in err and "Traceback" not in err
    assert marker.read_text() == "SIGTERM" and not _alive(fleet_pid)  # atexit: on_multirun_end never came


def test_a_killed_sweep_leaves_no_fleet_behind(tmp_path):
    sweep, marker, fleet_pid = _sweep_waiting_for_its_fleet(tmp_path)
    sweep.kill()  # SIGKILL: no atexit; the launcher's watchdog stops the fleet's process group
    sweep.wait(timeout=30)
    wait_for(lambda: not _alive(fleet_pid), timeout_s=60, what="the fleet to stop")
    assert marker.read_text() == "SIGTERM"
