"""Which children of a process hold a listening TCP socket, read from /proc: for a real vLLM replica started from a
standby, its engine core must hold none (agrpo/inference/standby.py, ServerlessForkContext). Used by the vLLM runs
that have a standby serve (tests/e2e/test_elastic.py) while the replica is up."""

from __future__ import annotations

from pathlib import Path

from agrpo.processes.ports import parse_listeners, socket_inodes


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(found))


def _listening_by_inode() -> dict[int, int]:
    by_inode = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            by_inode.update({inode: port for port, inode in parse_listeners(Path(table).read_text())})
        except OSError:
            continue
    return by_inode


def listening_ports_of(pid: int) -> set[int]:
    """The ports `pid` itself holds a listening socket of."""
    by_inode = _listening_by_inode()
    return {by_inode[inode] for inode in socket_inodes(pid) if inode in by_inode}


def listeners_held_by_children(pid: int) -> dict[int, list[int]]:
    """{child pid: ports it holds a listening socket of} for the children of `pid` that hold any (empty: none)."""
    by_inode = _listening_by_inode()
    held = {}
    for child in children(pid):
        ports = sorted(by_inode[inode] for inode in socket_inodes(child) if inode in by_inode)
        if ports:
            held[child] = ports
    return held
