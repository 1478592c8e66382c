"""Ports on a shared machine: reserved with a machine-wide lock for the run's life, and a listener proven ours."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from agrpo.errors import LaunchError
from agrpo.processes.ports import (
    free_ports,
    listener_owned_by,
    parse_listeners,
    port_locked_by_another_run,
    reserve_ports,
)


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    """Each test gets its own lock dir, so runs on this machine and other tests do not interfere."""
    monkeypatch.setenv("AGRPO_PORT_LOCK_DIR", str(tmp_path / "locks"))


def test_a_reserved_port_is_skipped_by_the_next_reservation_until_released():
    first = reserve_ports(2, 21500)
    assert len(first.ports) == 2
    second = reserve_ports(2, first.ports[0])
    assert not set(first.ports) & set(second.ports)
    assert all(port_locked_by_another_run(port) for port in first.ports)
    first.release()
    assert not port_locked_by_another_run(first.ports[0])
    third = reserve_ports(1, first.ports[0])
    assert third.ports == [first.ports[0]]
    second.release()
    third.release()


def test_a_reservation_held_by_another_process_is_skipped_and_dies_with_it():
    """Another launcher (a separate process) holds its ports until it exits, however it exits."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys
        from agrpo.processes.ports import reserve_ports
        held = reserve_ports(2, 21600)
        print(*held.ports, flush=True)
        sys.stdin.read()
    """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        theirs = [int(p) for p in holder.stdout.readline().split()]
        assert len(theirs) == 2
        ours = reserve_ports(2, 21600)
        assert not set(ours.ports) & set(theirs)
        assert not set(free_ports(2, 21600)) & set(theirs)  # unreserved helpers skip them too
        ours.release()
    finally:
        holder.kill()
        holder.wait()
    again = reserve_ports(2, 21600)  # the kernel dropped the killed holder's locks
    assert again.ports == sorted(theirs)
    again.release()


def test_a_bound_port_is_not_reserved():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        held = reserve_ports(1, port)
        assert held.ports != [port]
        held.release()


def test_no_ports_left_names_the_knob(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match="inference.base_port"):
            reserve_ports(1, port, search=1)


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1FA4 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0
   1: 0100007F:1FA4 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0 100 0 0 10 0
"""


def test_parse_listeners_keeps_listening_sockets_only():
    assert parse_listeners(PROC_NET_TCP) == [(8100, 4242), (22, 99)]


def test_listener_owned_by_tells_our_socket_from_anothers():
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        assert listener_owned_by(port, [os.getpid()]) is True
        assert listener_owned_by(port, [os.getppid()]) is False  # our parent holds no such socket
    assert listener_owned_by(port, [os.getpid()]) is False  # nobody listens any more
