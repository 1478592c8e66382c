"""Port locks in the per-user runtime directory (agrpo/processes/ports.py) against a second local user (uid 65534, real
processes): nothing they plant makes a reservation create or write a file outside the run's own directories, their
locks do not stop a run, and a run that finds no free port names who holds the range and the knob."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

from agrpo.errors import LaunchError
from agrpo.processes.port_holders import Holder, parse_flocks, parse_sockets, summary
from agrpo.processes.ports import LOCK_DIR_ENV, free_ports, lock_dir, reserve_ports
from agrpo.processes.private_dir import RUNTIME_ENV
from tests.hostile_user import NEEDS_ROOT, NOBODY, as_nobody, start_as_nobody, tree


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """This test's own runtime base (the port lock dir is <base>/ports)."""
    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "agrpo"))
    return tmp_path / "agrpo"


def test_locks_live_in_the_private_runtime_dir_0600_in_0700(runtime):
    held = reserve_ports(2, 21700)
    try:
        assert lock_dir() == runtime / "ports"
        assert stat.S_IMODE((runtime / "ports").lstat().st_mode) == 0o700
        for port in held.ports:
            info = (runtime / "ports" / f"{port}.lock").lstat()
            assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    finally:
        held.release()


def test_a_link_or_a_fifo_where_a_lock_file_goes_is_skipped_never_followed(runtime, tmp_path):
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (runtime / "ports").mkdir(parents=True, mode=0o700)
    os.chmod(runtime, 0o700)
    port = free_ports(1, 21720)[0]
    (runtime / "ports" / f"{port}.lock").unlink()  # free_ports made it: plant the link in its place
    (runtime / "ports" / f"{port}.lock").symlink_to(victim / "created-through-the-link")
    os.mkfifo(runtime / "ports" / f"{port + 1}.lock")  # a blocking open would hang the run
    held = reserve_ports(1, port)
    try:
        assert held.ports[0] > port + 1
        assert tree(victim) == []
    finally:
        held.release()


@pytest.mark.requires(NEEDS_ROOT)
def test_the_old_shared_lock_dir_trap_catches_nothing(monkeypatch, shared, tmp_path):
    """Issue 42's probe: another user makes the lock dir (1777, theirs) and plants <port>.lock -> a root-only path. A
    run given that directory refuses it; with the default it never looks there."""
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    trap = shared / "agrpo-ports"
    as_nobody(
        "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o1777); os.symlink(sys.argv[2], sys.argv[3])",
        str(trap),
        str(victim / "planted"),
        str(trap / "21740.lock"),
    )
    monkeypatch.setenv(LOCK_DIR_ENV, str(trap))
    with pytest.raises(LaunchError, match=rf"agrpo-ports belongs to uid {NOBODY}, not to you"):
        reserve_ports(1, 21740)
    with pytest.raises(LaunchError, match=r"belongs to uid"):
        free_ports(1, 21740)
    monkeypatch.delenv(LOCK_DIR_ENV)
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "agrpo"))
    reserve_ports(1, 21740).release()
    assert tree(victim) == [] and tree(trap) == ["21740.lock"]  # nothing created there, by either run


@pytest.mark.requires(NEEDS_ROOT)
def test_another_users_locks_on_the_range_do_not_stop_a_run(runtime, shared):
    """Their flocks are in their own directory: the ports are still free, so this run takes them (issue 42: 1,000
    flocks of another user stopped a run)."""
    holder = start_as_nobody(
        """
        import fcntl, os, sys
        os.mkdir(sys.argv[1], 0o700)
        fds = [os.open(f"{sys.argv[1]}/{p}.lock", os.O_RDONLY | os.O_CREAT, 0o600) for p in range(21760, 21770)]
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("held", flush=True)
        sys.stdin.read()
        """,
        str(shared / "theirs"),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        free = [port for port in range(21760, 21770) if free_ports(1, port, search=1) == [port]]
        held = reserve_ports(len(free), 21760, search=10)
        assert held.ports == free and len(free) >= 8
        held.release()
    finally:
        holder.kill()
        holder.wait()


def bound_range_holder(start: int, count: int) -> str:
    """Python code listening on `count` ports from `start` until its stdin closes (the stdlib only)."""
    return f"""
        import socket, sys
        socks = []
        for port in range({start}, {start + count}):
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen()
            socks.append(s)
        print("bound", flush=True)
        sys.stdin.read()
        """


@pytest.mark.requires(NEEDS_ROOT)
def test_a_range_another_user_binds_is_refused_naming_their_uid_pid_and_the_knob(runtime):
    start = free_ports(1, 21800, search=200)[0]
    assert free_ports(5, start, search=5)  # the five ports after it are free too
    holder = start_as_nobody(bound_range_holder(start, 5))
    try:
        assert holder.stdout.readline().strip() == "bound"
        with pytest.raises(LaunchError) as raised:
            reserve_ports(1, start, search=5)
    finally:
        holder.kill()
        holder.wait()
    message = str(raised.value)
    assert message.startswith(f"no 1 free ports between {start} and {start + 5} on 127.0.0.1: 5 ports listening")
    name = open(f"/proc/{os.getpid()}/comm").read().strip()  # setpriv execs the same interpreter in its own pid
    assert f"5 ports listening (uid {NOBODY}, pid {holder.pid} {name})" in message
    assert f"inference.base_port (e.g. inference.base_port={start + 5})" in message and "\n" not in message


def test_ports_reserved_by_another_run_of_ours_name_its_pid(runtime):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys
            from agrpo.processes.ports import reserve_ports
            held = reserve_ports(3, int(sys.argv[1]), search=3)
            print(*held.ports, flush=True)
            sys.stdin.read()
            """),
            str(free_ports(3, 21900, search=300)[0]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = [int(p) for p in holder.stdout.readline().split()]
        with pytest.raises(LaunchError) as raised:
            reserve_ports(1, theirs[0], search=3)
    finally:
        holder.kill()
        holder.wait()
    name = open(f"/proc/{os.getpid()}/comm").read().strip()  # the same interpreter
    assert f"3 ports reserved by another agrpo run of yours (uid {os.geteuid()}, pid {holder.pid} {name})" in str(
        raised.value
    )


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1FA4 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 4242 1 0 100 0 0 10 0
   1: 0100007F:1FA5 0100007F:D2F0 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0
   2: garbage
"""
PROC_LOCKS = """\
1: FLOCK  ADVISORY  WRITE 777 00:2d:5151 0 EOF
1: -> FLOCK  ADVISORY  WRITE 778 00:2d:5151 0 EOF
2: POSIX  ADVISORY  WRITE 779 00:2d:6161 0 EOF
"""


def test_the_proc_tables_are_parsed():
    assert parse_sockets(PROC_NET_TCP) == [(8100, "0A", 65534, 4242), (8101, "06", 0, 0)]
    assert parse_flocks(PROC_LOCKS) == {5151: 777}  # the waiter and the POSIX lock are not holders


def test_the_summary_puts_the_largest_holder_first():
    holders = {8100 + i: Holder("listening", 65534, 42) for i in range(5)}
    holders[8105] = Holder("in TIME_WAIT")
    holders[8106] = Holder("reserved by another agrpo run of yours", 0, 7)
    text = summary(holders, {42: "python3", 7: "python"})
    assert text == (
        "5 ports listening (uid 65534, pid 42 python3); 1 port in TIME_WAIT (holder not visible to this user); "
        "1 port reserved by another agrpo run of yours (uid 0, pid 7 python)"
    )
