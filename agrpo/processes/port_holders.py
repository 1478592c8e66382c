"""Who holds the ports a run found taken, as far as /proc tells: the uid and pid of each socket bound in the range
(/proc/net/tcp, tcp6 and the fds of the processes this user may read) and the pid of each agrpo lock held on it
(/proc/locks against the lock files' inodes). Read only when a run finds no free port, to name the holder in its
error; the parsing is pure, the reading below it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

STATES = {"0A": "listening", "06": "in TIME_WAIT"}  # any other state: a socket bound (or connected) from the port
SHOWN_GROUPS = 4


@dataclass(frozen=True)
class Holder:
    """What holds one port: `what` ("listening", "bound", "in TIME_WAIT", "reserved by another agrpo run", "lock
    file unusable"), and the uid and pid behind it where /proc tells (None where it does not)."""

    what: str
    uid: int | None = None
    pid: int | None = None


def parse_sockets(proc_net_tcp: str) -> list[tuple[int, str, int, int]]:
    """(local port, state, uid, inode) of every socket in the text of /proc/net/tcp or tcp6 (pure)."""
    sockets = []
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            sockets.append((int(fields[1].rsplit(":", 1)[1], 16), fields[3], int(fields[7]), int(fields[9])))
        except ValueError:
            continue
    return sockets


def parse_flocks(proc_locks: str) -> dict[int, int]:
    """{inode: pid} of every FLOCK in the text of /proc/locks (pure; a lock another pid namespace holds shows pid 0
    or -1 and is kept as it is)."""
    held = {}
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            held[int(fields[5].rsplit(":", 1)[1])] = int(fields[4])
        except ValueError:
            continue
    return held


def summary(holders: Mapping[int, Holder], names: Mapping[int, str]) -> str:
    """One clause per kind of holder, the largest first: "1000 ports bound by uid 65534 (pid 4242 python3)" (pure).
    `names` gives a pid's command name."""
    groups = Counter((h.what, h.uid, h.pid) for h in holders.values())
    clauses = []
    for (what, uid, pid), count in groups.most_common(SHOWN_GROUPS):
        who = [f"uid {uid}"] if uid is not None else []
        if pid is not None:
            who.append(f"pid {pid} {names.get(pid, '?')}".rstrip())
        by = f" ({', '.join(who)})" if who else " (holder not visible to this user)"
        clauses.append(f"{count} {'port' if count == 1 else 'ports'} {what}{by}")
    rest = sum(groups.values()) - sum(count for _, count in groups.most_common(SHOWN_GROUPS))
    if rest:
        clauses.append(f"{rest} more held otherwise")
    return "; ".join(clauses)


# ---- reading /proc ----------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def socket_owners(inodes: Iterable[int]) -> dict[int, int]:
    """{socket inode: pid} for the processes whose fds this user may read (all of them for root)."""
    wanted, found = {f"socket:[{inode}]" for inode in inodes if inode}, {}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                found[int(target[8:-1])] = int(entry)
    return found


def pid_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _lock_holders(ports: Iterable[int], lock_dir_fd: int) -> dict[int, Holder]:
    flocks = parse_flocks(_read("/proc/locks"))
    holders = {}
    for port in ports:
        try:
            inode = os.stat(f"{port}.lock", dir_fd=lock_dir_fd, follow_symlinks=False).st_ino
        except OSError:
            inode = None
        pid = flocks.get(inode) if inode is not None else None
        pid = pid if pid and pid > 0 else None
        holders[port] = Holder("reserved by another agrpo run of yours", pid_uid(pid) if pid else None, pid)
    return holders


def _socket_holders(ports: Iterable[int]) -> dict[int, Holder]:
    wanted = set(ports)
    sockets = [s for table in ("/proc/net/tcp", "/proc/net/tcp6") for s in parse_sockets(_read(table))]
    sockets = [s for s in sockets if s[0] in wanted]
    owners = socket_owners(inode for _, _, _, inode in sockets)
    holders: dict[int, Holder] = {}
    for port, state, uid, inode in sorted(sockets, key=lambda s: s[1] != "0A"):  # a listener names a port first
        if port not in holders:
            holders[port] = Holder(STATES.get(state, "bound"), uid if inode else None, owners.get(inode))
    return holders


def describe(busy: Mapping[int, str], lock_dir_fd: int | None) -> str:
    """Who holds the ports in `busy` ({port: "locked" | "unusable" | "bound"}, as the reservation found them)."""
    locked = [port for port, why in busy.items() if why == "locked"]
    holders = _lock_holders(locked, lock_dir_fd) if lock_dir_fd is not None else {}
    unusable = Holder("with a lock file that is not a plain file")
    holders.update({port: unusable for port, why in busy.items() if why == "unusable"})
    bound = [port for port, why in busy.items() if why == "bound"]
    sockets = _socket_holders(bound)
    holders.update({port: sockets.get(port, Holder("bound")) for port in bound})
    names = {pid: _read(f"/proc/{pid}/comm").strip() for pid in {h.pid for h in holders.values() if h.pid}}
    return summary(holders, names)
