"""TCP ports for a run's servers: reserved machine-wide for the run's life, and proven ours once a server answers.

A bind test alone leaves a window: two runs started together both find 8100 free, both start a server there, and
the second run's server answers the first run's health check. So each port a run plans is held with an exclusive
flock on <lock dir>/<port>.lock (machine-wide, default /tmp/agrpo-ports, every user's runs share it) by the
launcher until it exits; the kernel drops the lock when the launcher dies, however it dies. Another run skips
ports whose lock it cannot take. Processes outside agrpo do not take these locks, so readiness also checks that
the socket listening on the port belongs to the server's own process group (`listener_owned_by`).
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agrpo.errors import LaunchError

LOCK_DIR_ENV = "AGRPO_PORT_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/agrpo-ports"  # machine-wide on purpose: every run on the machine must see it
TCP_LISTEN = "0A"


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _lock_port(port: int) -> int | None:
    """An fd holding the exclusive lock of `port`, or None when another process holds it (or the lock file cannot
    be opened: then this run cannot coordinate on that port and leaves it alone)."""
    directory = lock_dir()
    try:
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o1777)  # shared by every user's runs, like /tmp itself
        fd = os.open(directory / f"{port}.lock", os.O_RDONLY | os.O_CREAT, 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def port_locked_by_another_run(port: int) -> bool:
    fd = _lock_port(port)
    if fd is None:
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


def reserve_ports(count: int, start: int, host: str = "127.0.0.1", search: int = 1000) -> PortReservation:
    """`count` ports at or above `start` that no other run has reserved and nothing is bound to, each locked."""
    reservation = PortReservation(ports=[])
    for port in range(start, min(start + search, 65536)):
        fd = _lock_port(port)
        if fd is None:
            continue
        if not port_free(port, host):
            os.close(fd)
            continue
        reservation.ports.append(port)
        reservation._fds.append(fd)
        if len(reservation.ports) == count:
            return reservation
    reservation.release()
    raise LaunchError(
        f"no {count} free ports between {start} and {start + search} on {host} (in use, or reserved "
        f"by other agrpo runs under {lock_dir()}): change inference.base_port"
    )


def free_ports(count: int, start: int, host: str = "127.0.0.1", search: int = 1000) -> list[int]:
    """`count` free ports at or above `start`, skipping ports in use or reserved by a running agrpo launcher; nothing
    is held (tests and helpers that bind at once)."""
    found = []
    for port in range(start, min(start + search, 65536)):
        if port_free(port, host) and not port_locked_by_another_run(port):
            found.append(port)
            if len(found) == count:
                return found
    raise LaunchError(
        f"no {count} free ports between {start} and {start + search} on {host}: change inference.base_port"
    )


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
