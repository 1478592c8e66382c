"""Standby spares (inference.fleet.standby): the vLLM names the standby relies on exist in the installed vLLM (an
upgrade that moves one fails here, not in a run), and a standby waits until it is added, then runs its server module
with its arguments; without a standby the same process runs it at once; a go file where others can write is refused;
the engine core, forked from the standby, holds none of the API server's sockets (read from /proc/<pid>/fd and
/proc/net/tcp). Real processes with a stand-in server module (tests/inference/standby_standin.py); the real vLLM
standby runs in tests/e2e/test_elastic.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agrpo.errors import LaunchError
from agrpo.inference.standby import (
    STANDBY_MODULE,
    ServerlessForkContext,
    ServerlessForkProcess,
    fork_engine_core,
    is_server_socket,
    missing_names,
)
from agrpo.launchers.standby_spare import StandbyProcess
from agrpo.processes.ports import listening_inodes, socket_inodes
from tests.inference.engine_sockets import listeners_held_by_children
from tests.processes import wait_for

REPO = Path(__file__).resolve().parents[2]
STANDIN = "tests.inference.standby_standin"


def test_the_installed_vllm_has_every_name_the_standby_relies_on():
    assert missing_names() == []


def spare(tmp_path: Path) -> tuple[StandbyProcess, Path]:
    out = tmp_path / "served.json"
    argv = [sys.executable, "-m", STANDBY_MODULE, STANDIN, str(out), "--port", "8101"]
    process = StandbyProcess(
        "vllm-1", argv, {"PYTHONPATH": str(REPO)}, tmp_path / "vllm-1.log", None, go_path=tmp_path / "fleet/vllm-1.go"
    )
    return process, out


def served(path: Path) -> dict:
    """What the stand-in server was given, once it wrote it."""
    wait_for(path.exists, 30, f"the stand-in server to write {path.name}", poll_s=0.05)
    return json.loads(path.read_text())


def test_a_standby_waits_until_added_then_serves_with_its_arguments(tmp_path):
    process, out = spare(tmp_path)
    process.stand_by()
    try:
        log_path = tmp_path / "vllm-1.log"
        wait_for(lambda: "holding no device" in log_path.read_text(), 30, "the standby's imports", poll_s=0.05)
        time.sleep(0.5)
        assert process.standing_by() and not out.exists()  # imported, waiting
        process.start()  # the go
        given = served(out)
        assert given["rest"] == ["--port", "8101"] and given["argv"][0].endswith("standby_standin.py")
        assert given["go_env"] is None  # the server (and vLLM's engine core) must not wait in turn
        assert process.wait() == 0 and not process.standing_by()
        log = (tmp_path / "vllm-1.log").read_text()
        assert log.index("holding no device") < log.index("agrpo standby: added; the server starts")
    finally:
        process.stop(timeout_s=5)


def test_without_a_standby_the_spare_starts_cold_and_serves_at_once(tmp_path):
    process, out = spare(tmp_path)
    process.start()
    try:
        assert served(out)["rest"] == ["--port", "8101"]
        assert process.wait() == 0 and "holding no device" not in (tmp_path / "vllm-1.log").read_text()
    finally:
        process.stop(timeout_s=5)


def test_a_standby_that_ended_is_replaced_by_a_cold_start(tmp_path):
    process, out = spare(tmp_path)
    process.stand_by()
    os.killpg(process.pid, signal.SIGKILL)  # e.g. killed while it waited
    process.popen.wait()
    assert process.waiting and not process.standing_by()
    process.start()
    try:
        assert served(out)["rest"] == ["--port", "8101"]
    finally:
        process.stop(timeout_s=5)


# ---- the forked engine core holds no server socket (issue 42, item 5) ------------------------------------------

FORKED_AFTER_BIND = """
import sys, socket, multiprocessing, time
from agrpo.inference.standby import ServerlessForkContext
context = ServerlessForkContext() if sys.argv[1] == "serverless" else multiprocessing.get_context("fork")
sock = socket.socket()
sock.bind(("127.0.0.1", 0))  # as vLLM's setup_server: bound before the engine core starts, listening after
child = context.Process(target=time.sleep, args=(120,))  # killed below
child.start()
sock.listen()
print(child.pid, sock.getsockname()[1], flush=True)
sys.stdin.read()
child.kill()
"""


def engine_core_holds_the_listener(mode: str) -> tuple[bool, bool]:
    """(the forked child holds the parent's listening socket, the parent does), read from /proc/<pid>/fd and
    /proc/net/tcp while both run (tests/inference/engine_sockets.py, which the real vLLM runs use too): `mode`
    "serverless" (the standby's context) or "fork" (multiprocessing's)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKED_AFTER_BIND, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        child, port = (int(field) for field in parent.stdout.readline().split())
        listening = listening_inodes(port)
        assert listening, "the parent listens"
        held = listeners_held_by_children(parent.pid)
        assert held in ({}, {child: [port]}), held
        return bool(held), listening <= socket_inodes(parent.pid)
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)


def test_a_child_forked_through_the_standbys_context_holds_no_server_socket():
    assert engine_core_holds_the_listener("fork") == (True, True)  # what vLLM's engine core did: the check can fail
    assert engine_core_holds_the_listener("serverless") == (False, True)


def test_only_bound_unconnected_tcp_sockets_count_as_a_servers():
    assert is_server_socket(socket.AF_INET, socket.SOCK_STREAM, 8000, connected=False)
    assert is_server_socket(socket.AF_INET6, socket.SOCK_STREAM, 8000, connected=False)
    assert not is_server_socket(socket.AF_INET, socket.SOCK_STREAM, 8000, connected=True)  # a client's connection
    assert not is_server_socket(socket.AF_INET, socket.SOCK_STREAM, 0, connected=False)  # not bound
    assert not is_server_socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, connected=False)  # vLLM's ZMQ ipc
    assert not is_server_socket(socket.AF_INET, socket.SOCK_DGRAM, 8000, connected=False)


def test_the_standby_has_vllm_fork_its_engine_core_through_that_context(monkeypatch):
    import vllm.v1.engine.utils as engine_utils

    monkeypatch.setattr(engine_utils, "get_mp_context", engine_utils.get_mp_context)  # restored after the test
    fork_engine_core()
    context = engine_utils.get_mp_context()
    assert isinstance(context, ServerlessForkContext) and context.get_start_method() == "fork"
    assert context.Process is ServerlessForkProcess


def test_where_vllm_chooses_its_start_method_a_fork_becomes_serverless_and_spawn_stays(monkeypatch):
    """A GPU machine: vLLM forks its engine core itself (CUDA not initialised), or spawns it; only a fork changes."""
    import multiprocessing

    import vllm.v1.engine.utils as engine_utils

    for vllms_choice, expected in (
        ("fork", ServerlessForkContext),
        ("spawn", type(multiprocessing.get_context("spawn"))),
    ):
        monkeypatch.setattr(engine_utils, "get_mp_context", lambda: multiprocessing.get_context(vllms_choice))
        fork_engine_core(always=False)
        assert type(engine_utils.get_mp_context()) is expected


def test_a_go_file_where_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    process = StandbyProcess("vllm-1", ["true"], {}, tmp_path / "vllm-1.log", None, go_path=shared / "vllm-1.go")
    with pytest.raises(
        LaunchError,
        match=r"vllm-1's standby go file .*shared/vllm-1\.go cannot be there: .* has mode "
        r"1777: other users can create files in it",
    ):
        process.stand_by()
    done = subprocess.run(
        [sys.executable, "-m", STANDBY_MODULE, STANDIN, str(tmp_path / "served.json")],
        env={**os.environ, "PYTHONPATH": str(REPO), "AGRPO_STANDBY_GO": str(shared / "vllm-1.go")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and not (tmp_path / "served.json").exists()
    assert done.stderr.startswith(f"agrpo standby: refusing the go file {shared / 'vllm-1.go'}: {shared} has mode 1777")
    assert "Traceback" not in done.stderr
