"""ManagedProcess: health waits report the log tail, and stop() leaves no process of the group behind."""

import os
import subprocess
import sys
import time

import pytest

from agrpo.errors import LaunchError
from agrpo.processes.ports import free_ports, port_free
from agrpo.processes.managed import ManagedProcess


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_child_that_dies_before_healthy_reports_its_log_tail(tmp_path):
    proc = ManagedProcess(
        "fake-server",
        [sys.executable, "-c", "print('boom: cannot load model'); raise SystemExit(3)"],
        log_path=tmp_path / "s.log",
        health_url="http://127.0.0.1:9/health",
    )
    proc.start()
    with pytest.raises(LaunchError) as error:
        proc.wait_healthy(timeout_s=30, poll_s=0.1)
    assert "exited with code 3" in str(error.value)
    assert "boom: cannot load model" in str(error.value)


def test_health_timeout_names_the_knob(tmp_path):
    proc = ManagedProcess(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / "s.log",
        health_url="http://127.0.0.1:9/health",
    )
    proc.start()
    try:
        with pytest.raises(LaunchError, match="inference.startup_timeout_s"):
            proc.wait_healthy(timeout_s=0.5, poll_s=0.1)
    finally:
        proc.stop(timeout_s=5)
    assert not proc.alive()


def test_a_trainer_that_exits_while_a_replica_boots_ends_the_wait_at_once_with_its_error(tmp_path):
    """launcher.trainer_during_boot: the executor's check (agrpo/launchers/local.py) on real processes."""
    from agrpo.trainer.trainer_error import trainer_error_file, trainer_still_running

    trainer_error_file(tmp_path).parent.mkdir(parents=True)
    booting = ManagedProcess(
        "vllm-0",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / "r.log",
        health_url="http://127.0.0.1:9/health",
    )
    script = f"open({str(trainer_error_file(tmp_path))!r}, 'w').write('the dataset has no column answer'); exit(2)"
    trainer = ManagedProcess("trainer", [sys.executable, "-c", script])
    booting.start()
    trainer.start()
    try:
        with pytest.raises(LaunchError) as error:  # the trainer's error, not the replica's 60 s timeout
            booting.wait_healthy(timeout_s=60, poll_s=0.1, check=lambda: trainer_still_running(trainer, tmp_path))
        assert booting.alive()  # the wait ended while the replica still booted
    finally:
        booting.stop(timeout_s=5)
    assert trainer.exit_code == 2 and not booting.alive()
    message = str(error.value)
    assert message.startswith("the dataset has no column answer. The trainer exited with code 2")
    assert message.endswith("It ended while the replicas were still starting; they were stopped")


def test_stop_kills_the_whole_group_including_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    proc = ManagedProcess("parent", [sys.executable, "-c", script], log_path=tmp_path / "p.log")
    proc.start()
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert pid_alive(grandchild)
    proc.stop(timeout_s=5)
    time.sleep(0.2)
    assert not proc.alive()
    assert not pid_alive(grandchild)


def test_a_child_that_ignores_sigterm_is_killed_and_said_so(tmp_path, caplog):
    """The launcher's stop budget (launcher.stop_timeout_s): SIGKILL after it, with one line naming the process, so a
    run's end that needed SIGKILL shows (tests/launchers/test_hygiene.py asserts no process needed it)."""
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
    proc = ManagedProcess("stubborn", [sys.executable, "-c", script], log_path=tmp_path / "s.log")
    proc.start()
    for _ in range(200):
        if "ready" in (tmp_path / "s.log").read_text():
            break
        time.sleep(0.05)
    with caplog.at_level("WARNING", logger="agrpo.processes.managed"):
        proc.stop(timeout_s=1)
    assert proc.popen.returncode == -9
    assert [r.getMessage() for r in caplog.records] == [
        "stubborn did not exit within 1 s of SIGTERM (launcher.stop_timeout_s); killed it"
    ]


def test_free_ports_skip_ports_in_use():
    import socket

    start = free_ports(1, 20500)[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", start))
        busy.listen()
        assert not port_free(start)
        ports = free_ports(2, start)
    assert start not in ports and len(ports) == 2 and all(p > start for p in ports)


def serve_health(directory, port):
    """argv of a tiny real HTTP server answering 200 on /health (a file of that name in `directory`)."""
    (directory / "health").write_text("ok")
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)]


def test_healthy_only_when_the_answer_comes_from_the_childs_own_socket(tmp_path, held_port):
    port = held_port
    ours = ManagedProcess(
        "server",
        serve_health(tmp_path, port),
        log_path=tmp_path / "s.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    ours.start()
    try:
        ours.wait_healthy(timeout_s=60, poll_s=0.1)
        assert ours.serves_its_port()
    finally:
        ours.stop(timeout_s=5)


def test_another_process_answering_on_our_port_is_not_our_server(tmp_path, held_port):
    """Two runs on one port: the second run's server answers /health, but the first run's child holds no socket
    there, so the first run must not call its replica healthy (it did: "healthy after 0 s")."""
    port = held_port
    (tmp_path / "theirs").mkdir()
    theirs = ManagedProcess(
        "their-server",
        serve_health(tmp_path / "theirs", port),
        log_path=tmp_path / "t.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    theirs.start()
    ours = ManagedProcess(
        "vllm-0",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / "o.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        theirs.wait_healthy(timeout_s=60, poll_s=0.1)
        ours.start()
        with pytest.raises(LaunchError, match="Another process, not vllm-0, answers"):
            ours.wait_healthy(timeout_s=2, poll_s=0.1)
    finally:
        ours.stop(timeout_s=5)
        theirs.stop(timeout_s=5)


def test_children_and_renamed_grandchildren_die_when_the_launcher_is_killed(tmp_path, run_token):
    """SIGKILL of the launcher runs none of its code: the watchdog stops the groups it was told about, including a
    grandchild that renamed itself (as vLLM's "VLLM::EngineCore" does), found by the run's marker."""
    from tests.processes import RunProcesses

    grandchild = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', "
        "\"import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(300)\"]); "
        "time.sleep(300)"
    )
    launcher = (
        "import sys, time; from pathlib import Path; from agrpo.processes.managed import ManagedProcess; "
        f"p = ManagedProcess('replica', [sys.executable, '-c', {grandchild!r}], log_path=Path(sys.argv[1])); "
        "p.start(); print('started', flush=True); time.sleep(300)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, str(tmp_path / "r.log")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "started"
    run = RunProcesses(run_token)
    found = run.wait_for(lambda f: "VLLM::EngineCor" in f.values(), timeout_s=30)  # /proc keeps 15 characters
    assert "VLLM::EngineCor" in found.values(), found
    proc.kill()
    proc.wait()
    assert run.left_behind(timeout_s=30) == {}


def test_watchdog_stops_only_the_groups_still_listed_at_end_of_file(monkeypatch):
    import io

    from agrpo.processes import watchdog

    stopped = []
    monkeypatch.setattr(watchdog, "stop_groups", lambda groups: stopped.append(groups))
    watchdog.watch(io.StringIO("+101 5000\n+202 6000\n-101\n+303 None\nnoise\n"))
    assert stopped == [{202: 6000, 303: None}]
    watchdog.watch(io.StringIO("+101 5000\n-101\n"))
    assert len(stopped) == 1  # nothing left to stop: the launcher stopped its children itself


def test_a_group_is_ours_only_while_its_leader_is_the_one_started(tmp_path):
    from agrpo.processes.watchdog import group_is_ours, start_time

    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "s.log")
    proc.start()
    try:
        assert proc.leader_start == start_time(proc.pid)
        assert group_is_ours(proc.pid, proc.leader_start)
        assert not group_is_ours(proc.pid, proc.leader_start + 1)  # same id, another leader: not ours
    finally:
        proc.stop(timeout_s=5)
    assert not group_is_ours(proc.pid, proc.leader_start)  # gone


def test_a_restart_first_kills_what_is_left_of_the_previous_group(tmp_path):
    """A replica's API server dies but its engine core lives on in the group: restarting must not leave it behind."""
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    proc = ManagedProcess("replica", [sys.executable, "-c", script], log_path=tmp_path / "p.log")
    proc.start()
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    orphan = int(pid_file.read_text())
    os.kill(proc.pid, 9)  # the leader dies, its child stays in the group
    proc.popen.wait()
    assert pid_alive(orphan)
    proc.start()
    try:
        time.sleep(0.2)
        assert not pid_alive(orphan)
        assert proc.alive()
    finally:
        proc.stop(timeout_s=5)


def test_a_child_that_finds_its_port_taken_says_so_and_names_the_knob(tmp_path):
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = ManagedProcess(
            "vllm-0",
            serve_health(tmp_path, port),
            log_path=tmp_path / "s.log",
            health_url=f"http://127.0.0.1:{port}/health",
        )
        proc.start()
        with pytest.raises(LaunchError) as error:
            proc.wait_healthy(timeout_s=60, poll_s=0.1)
    message = str(error.value)
    assert f"Port {port} was taken by another program" in message and "inference.base_port" in message
