"""TCP ports for a run's servers: reserved for the run's life, and proven ours once a server answers.

A bind test alone leaves a window: two runs started together both find 8100 free, both start a server there, and
the second run's server answers the first run's health check. So each port a run plans is held with an exclusive
flock on <lock dir>/<port>.lock by the launcher until it exits; the kernel drops the lock when the launcher dies,
however it dies. Another run of the same user skips ports whose lock it cannot take.

The lock dir is per user (<runtime dir>/ports, agrpo/processes/private_dir.py: mode 0700, owner checked, never a link
followed), and each lock file is opened relative to its descriptor with O_NOFOLLOW: another user can neither read
the locks nor make a run create or write a file through them. Runs of different users do not see each other's locks;
between them the kernel's bind test decides, and readiness checks that the socket listening on the port belongs to
the server's own process group (`listener_owned_by`), as it does for processes outside agrpo. docs/security.md,
"Port locks", says why this and not a machine-wide directory.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agrpo.errors import LaunchError
from agrpo.processes.port_holders import describe
from agrpo.processes.private_dir import open_private_dir, open_runtime_dir, runtime_base

LOCK_DIR_ENV = "AGRPO_PORT_LOCK_DIR"  # a private directory of one's own instead (tests give each test its own)
LOCK_SUBDIR = "ports"
# never a link, never a FIFO's blocking open, never inherited by a child
LOCK_FLAGS = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TCP_LISTEN = "0A"


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or runtime_base() / LOCK_SUBDIR)


def open_lock_dir() -> int:
    """A descriptor of the lock dir, made private (0700) when absent; a LaunchError when it is not a private directory
    of this user's."""
    explicit = os.environ.get(LOCK_DIR_ENV)
    return open_private_dir(explicit) if explicit else open_runtime_dir(LOCK_SUBDIR)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _lock_port(port: int, dir_fd: int) -> int | str:
    """An fd holding the exclusive lock of `port`, or why not: "locked" (another run of this user holds it) or
    "unusable" (the name is a link or not a plain file: nothing is followed or created through it)."""
    try:
        fd = os.open(f"{port}.lock", LOCK_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError:
        return "unusable"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return "unusable"
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return "locked"
    return fd


def port_locked_by_another_run(port: int) -> bool:
    dir_fd = open_lock_dir()
    try:
        fd = _lock_port(port, dir_fd)
    finally:
        os.close(dir_fd)
    if isinstance(fd, str):
        return True
    os.close(fd)
    return False


@dataclass
class PortReservation:
    """Ports held for this run: their locks last until `release()` or the end of this process."""

    ports: list[int]
    _fds: list[int] = field(default_factory=list, repr=False)

    def release(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


def no_ports_error(count: int, start: int, end: int, host: str, holders: str) -> LaunchError:
    return LaunchError(
        f"no {count} free ports between {start} and {end} on {host}: {holders or 'all in use'}. Change "
        f"inference.base_port (e.g. inference.base_port={end}), or stop what holds the range"
    )


def reserve_ports(count: int, start: int, host: str = "127.0.0.1", search: int = 1000) -> PortReservation:
    """`count` ports at or above `start` that no other run of this user has reserved and nothing is bound to, each
    locked. None free: a LaunchError naming who holds the range (port_holders.py) and the knob."""
    reservation, busy = PortReservation(ports=[]), {}
    dir_fd = open_lock_dir()
    try:
        for port in range(start, min(start + search, 65536)):
            fd = _lock_port(port, dir_fd)
            if isinstance(fd, str):
                busy[port] = fd
                continue
            if not port_free(port, host):
                os.close(fd)
                busy[port] = "bound"
                continue
            reservation.ports.append(port)
            reservation._fds.append(fd)
            if len(reservation.ports) == count:
                return reservation
        reservation.release()
        raise no_ports_error(count, start, min(start + search, 65536), host, describe(busy, dir_fd))
    finally:
        os.close(dir_fd)


def free_ports(count: int, start: int, host: str = "127.0.0.1", search: int = 1000) -> list[int]:
    """`count` free ports at or above `start`, skipping ports in use or reserved by a running agrpo launcher of this
    user; nothing is held (tests and helpers that bind at once)."""
    found, busy = [], {}
    dir_fd = open_lock_dir()
    try:
        for port in range(start, min(start + search, 65536)):
            if not port_free(port, host):
                busy[port] = "bound"
                continue
            fd = _lock_port(port, dir_fd)
            if isinstance(fd, str):
                busy[port] = fd
                continue
            os.close(fd)
            found.append(port)
            if len(found) == count:
                return found
        raise no_ports_error(count, start, min(start + search, 65536), host, describe(busy, dir_fd))
    finally:
        os.close(dir_fd)


def parse_listeners(proc_net_tcp: str) -> list[tuple[int, int]]:
    """(port, socket inode) of every listening socket in the text of /proc/net/tcp or /proc/net/tcp6 (pure)."""
    listeners = []
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        listeners.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[9])))
    return listeners


def listening_inodes(port: int) -> set[int] | None:
    """Inodes of the sockets listening on `port` (any address); None where /proc/net is not there to read."""
    inodes, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = Path(table).read_text()
        except OSError:
            continue
        readable = True
        inodes |= {inode for listen_port, inode in parse_listeners(text) if listen_port == port}
    return inodes if readable else None


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets `pid` holds open (empty when its fds cannot be read)."""
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def listener_owned_by(port: int, pids: Iterable[int]) -> bool | None:
    """Whether every socket listening on `port` is held by one of `pids` (and there is one). None when this machine
    has no /proc to tell (the caller then trusts the health answer alone)."""
    listeners = listening_inodes(port)
    if listeners is None:
        return None
    if not listeners:
        return False
    held = set().union(*(socket_inodes(pid) for pid in pids)) if pids else set()
    return listeners <= held
