"""Find a run's processes by its marker, not by command line.

Every process a launcher starts carries AGRPO_RUN_TOKEN in its environment (/proc/<pid>/environ). vLLM's engine core
renames itself with setproctitle ("VLLM::EngineCore"), which also wipes what /proc shows of its environment, so a
run's processes are: those carrying the marker, plus every process in a session one of them leads or belongs to
(each child of the launcher leads its own session; vLLM's children stay in it). Sessions are recorded while the
run is up (`RunProcesses.snapshot`), so a renamed child whose session leader has died is still found.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agrpo.processes.ports import reserve_ports
from agrpo.processes.watchdog import carries_token, proc_stat


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as name:
            return name.read().strip()
    except OSError:
        return "?"


class RunProcesses:
    def __init__(self, token: str):
        self.token = token
        self.sessions: set[int] = set()

    def snapshot(self) -> dict[int, str]:
        """pid -> name of every live process of the run now; records the sessions of the marked ones."""
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                stat = proc_stat(int(entry))
                if stat is not None and stat[0] != "Z":  # a zombie waiting to be reaped holds nothing
                    stats[int(entry)] = stat
        marked = {pid for pid in stats if carries_token(pid, self.token)}
        self.sessions |= {stats[pid][2] for pid in marked} - {os.getsid(0)}  # never the test's own session
        return {pid: comm(pid) for pid, stat in stats.items() if pid in marked or stat[2] in self.sessions}

    def wait_for(self, predicate, timeout_s: float = 120.0, poll_s: float = 0.5) -> dict[int, str]:
        """Poll until `predicate(processes)` holds; return them (the last ones seen if it never does)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.snapshot()
            if predicate(found) or time.monotonic() > deadline:
                return found
            time.sleep(poll_s)

    def left_behind(self, timeout_s: float = 60.0) -> dict[int, str]:
        """The run's processes still alive after up to `timeout_s` (a bounded wait, not a timed assertion: teardown
        takes vLLM a few seconds); empty when everything is gone."""
        return self.wait_for(lambda found: not found, timeout_s)


def left_behind(token: str, timeout_s: float = 60.0) -> dict[int, str]:
    """Processes carrying the marker `token` (and their sessions' members) still alive after up to `timeout_s`."""
    return RunProcesses(token).left_behind(timeout_s)


def trainer_pids(run_dir: Path) -> list[int]:
    """The trainer process of this run (python -m agrpo.trainer <run_dir>/config.yaml), found by its command line:
    it is agrpo's own process, not one of vLLM's renamed ones."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agrpo.trainer" in argv and str(run_dir / "config.yaml").encode() in argv:
                found.append(int(entry.name))
    return found


def read(path: Path) -> str:
    """A log file as far as it is written (empty before it exists)."""
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.5):
    """Poll `predicate` until it returns something true (returned), or fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextmanager
def held_ports(count: int, start: int) -> Iterator[list[int]]:
    """`count` ports at or above `start`, held with agrpo's port locks (agrpo/processes/ports.py) until the block
    ends. A port found free and then bound later is a race: another test session on the machine (a second `make
    test`) or a launcher could take it in between; while the lock is held they skip it, as runs skip each other's."""
    reservation = reserve_ports(count, start)
    try:
        yield reservation.ports
    finally:
        reservation.release()


class Drained(subprocess.Popen):
    """A Popen whose stdout and stderr (text pipes) are read by threads as they come. A pipe read only at the end
    holds 64 KiB: a chatty child then blocks on its next write and never exits, and the test waits out its limit.
    `communicate` returns what came, as Popen's does; `output()` what came so far."""

    def __init__(self, args, **kwargs):
        super().__init__(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        self._parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._readers = [threading.Thread(target=self._drain, args=(name,), daemon=True) for name in self._parts]
        for reader in self._readers:
            reader.start()

    def _drain(self, name: str) -> None:
        stream = getattr(self, name)
        for line in iter(stream.readline, ""):
            self._parts[name].append(line)

    def output(self) -> tuple[str, str]:
        return "".join(self._parts["stdout"]), "".join(self._parts["stderr"])

    def communicate(self, input=None, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child (TimeoutExpired after `timeout`, as Popen's), then for its output's end: bounded, since
        a grandchild still holding the pipes would keep it open."""
        self.wait(timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        return self.output()


def agrpo(*args, cwd, env=None, timeout=180) -> subprocess.CompletedProcess:
    """`python -m agrpo *args` as a user runs it, offline (HF_HUB_OFFLINE=1), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "agrpo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
