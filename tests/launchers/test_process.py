"""ManagedProcess: health waits report the log tail, and stop() leaves no process of the group behind."""

import os
import sys
import time

import pytest

from agrpo.errors import LaunchError
from agrpo.launchers.ports import free_ports, port_free
from agrpo.launchers.process import ManagedProcess


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_child_that_dies_before_healthy_reports_its_log_tail(tmp_path):
    proc = ManagedProcess("fake-server", [sys.executable, "-c", "print('boom: cannot load model'); raise SystemExit(3)"],
                          log_path=tmp_path / "s.log", health_url="http://127.0.0.1:9/health")
    proc.start()
    with pytest.raises(LaunchError) as error:
        proc.wait_healthy(timeout_s=30, poll_s=0.1)
    assert "exited with code 3" in str(error.value)
    assert "boom: cannot load model" in str(error.value)


def test_health_timeout_names_the_knob(tmp_path):
    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"],
                          log_path=tmp_path / "s.log", health_url="http://127.0.0.1:9/health")
    proc.start()
    try:
        with pytest.raises(LaunchError, match="inference.startup_timeout_s"):
            proc.wait_healthy(timeout_s=0.5, poll_s=0.1)
    finally:
        proc.stop(timeout_s=5)
    assert not proc.alive()


def test_stop_kills_the_whole_group_including_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
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


def test_free_ports_skip_ports_in_use():
    import socket

    start = free_ports(1, 20500)[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", start))
        busy.listen()
        assert not port_free(start)
        ports = free_ports(2, start)
    assert start not in ports and len(ports) == 2 and all(p > start for p in ports)
