"""Hold processes to a share of one CPU core with a cgroup CPU quota (root only), for straggler tests and benchmarks.

A replica held to a quarter of a core is a real straggler: its engine runs, answers and loads adapters, four times
slower. cgroup v1's `cpu` controller (`cpu.cfs_quota_us` over `cpu.cfs_period_us`, as on this project's machines) or
cgroup v2's `cpu.max` where the v2 hierarchy has the cpu controller. Processes are moved back to the root group and
the group is removed on the way out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _hierarchy() -> tuple[str, Path] | None:
    if (V1 / "cpu.cfs_quota_us").is_file():
        return "v1", V1
    controllers = V2 / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text(errors="replace").split():
        return "v2", V2
    return None


def cpu_quota_unavailable() -> str | None:
    """Why a quota cannot be set here, or None."""
    if os.geteuid() != 0:
        return "needs root to create a cgroup"
    if _hierarchy() is None:
        return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)"
    return None


def process_group(pgid: int) -> list[int]:
    """Every process of a process group (a replica: its API server, engine core and their children)."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid, group in (line.split() for line in out.splitlines()) if int(group) == pgid]


@contextlib.contextmanager
def cpu_quota(pids: list[int], share: float, name: str) -> Iterator[Path]:
    """Hold `pids` (together) to `share` of one core while inside."""
    kind, root = _hierarchy()
    group = root / f"agrpo-{name}"
    group.mkdir(exist_ok=True)
    try:
        if kind == "v1":
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)))
        else:
            (group / "cpu.max").write_text(f"{int(share * PERIOD_US)} {PERIOD_US}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
        group.rmdir()
