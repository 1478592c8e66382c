"""A watchdog per launcher process: when the launcher dies, however it dies, its children's process groups die too.

The launcher's children (vLLM replicas, the proxy, the trainer) each run in their own process group, so neither
a closed terminal nor a SIGKILL of the launcher reaches them, and a parent-death signal (PR_SET_PDEATHSIG) would
reach only the direct child, not vLLM's engine core (a grandchild renamed "VLLM::EngineCore"). So the launcher
starts one small process in its own session and tells it, over a pipe, which process groups it owns ("+PGID START",
START being the group leader's start time, when one starts; "-PGID" once the launcher stopped it itself). The
launcher never hands the pipe's end to anyone else, so the watchdog reads end-of-file exactly when the launcher is
gone (normal exit, exception, SIGKILL) and then stops every group still listed: SIGTERM, a grace period, SIGKILL.

A group is only signalled while it is provably the one started (`group_is_ours`): its leader alive with the
recorded start time, or its leader gone and members left (Linux does not hand out a group's id again while any
process is still in that group).

Every child also inherits the run's marker, AGRPO_RUN_TOKEN, to find a run's processes by /proc/*/environ rather
than by command line. vLLM's engine core renames itself with setproctitle ("VLLM::EngineCore"), which also wipes
what /proc shows of its environment: it is found through its session instead (every child of the launcher leads
its own session, and vLLM's children stay in it).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

RUN_TOKEN_ENV = "AGRPO_RUN_TOKEN"
GRACE_S = 10.0


def run_token() -> str:
    """This process's run marker: taken from the environment (an outer tool or test may set it) or made once and put
    there, so every child started from now on inherits it."""
    token = os.environ.get(RUN_TOKEN_ENV, "")
    if not re.fullmatch(r"[\w.-]+", token):  # unset, or unusable as one word of the watchdog's protocol
        token = os.environ[RUN_TOKEN_ENV] = secrets.token_hex(8)
    return token


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, process group, session, start time in clock ticks) of `pid` from /proc/<pid>/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    # priority nice threads itrealvalue starttime ...": comm may hold spaces and ")", so split after the last ")"
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])


def process_groups() -> dict[int, int]:
    """pid -> process group of every live (not zombie) process visible in /proc (Linux)."""
    groups = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[0] != "Z":
                groups[int(entry)] = stat[1]
    return groups


def group_members(pgid: int) -> list[int]:
    return [pid for pid, group in process_groups().items() if group == pgid]


def start_time(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[3] if stat else None


def group_is_ours(pgid: int, leader_start: int | None) -> bool:
    """Whether group `pgid` is still the one whose leader started at `leader_start`: the leader is alive with that
    start time, or the leader is gone and members remain (vLLM's engine core outliving its API server)."""
    members = group_members(pgid)
    if not members:
        return False
    if pgid in members:
        return start_time(pgid) == leader_start
    return True


def carries_token(pid: int, token: str) -> bool:
    """Whether `pid`'s environment holds AGRPO_RUN_TOKEN=`token` (False when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return f"{RUN_TOKEN_ENV}={token}".encode() in environ.read().split(b"\0")
    except OSError:
        return False


def stop_groups(groups: dict[int, int | None], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group in `groups` (pgid -> its leader's start time) that is still ours; SIGKILL what is left
    after `grace_s`."""
    ours = {g for g, leader_start in groups.items() if group_is_ours(g, leader_start)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in ours:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            alive = set(process_groups().values())
            ours = {g for g in ours if g in alive}
            if not ours:
                return
            time.sleep(0.2)


def watch(stream) -> None:
    """The watchdog's loop: track groups from the launcher's lines; on end-of-file stop those still listed."""
    groups: dict[int, int | None] = {}
    for line in stream:
        words = line.split()
        if len(words) == 2 and words[0][:1] == "+" and words[0][1:].isdigit():
            groups[int(words[0][1:])] = int(words[1]) if words[1].isdigit() else None
        elif len(words) == 1 and words[0][:1] == "-" and words[0][1:].isdigit():
            groups.pop(int(words[0][1:]), None)
    if groups:
        stop_groups(groups)


class Watchdog:
    """The launcher's side: starts the watchdog process on first use and tells it which groups to stop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._popen: subprocess.Popen | None = None

    def _ensure_started(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            return
        # by file, isolated (-I): this module needs only the standard library, so the child need not find the package
        self._popen = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            close_fds=True,
        )

    def _send(self, line: str) -> None:
        try:
            self._popen.stdin.write(line + "\n")
            self._popen.stdin.flush()
        except (OSError, ValueError, AttributeError):
            pass  # the watchdog is gone: the launcher's own teardown still stops its children

    def watch(self, pgid: int, leader_start: int | None) -> None:
        with self._lock:
            self._ensure_started()
            self._send(f"+{pgid} {leader_start}")

    def forget(self, pgid: int) -> None:
        with self._lock:
            if self._popen is not None:
                self._send(f"-{pgid}")


WATCHDOG = Watchdog()  # one per launcher process; its pipe closes when the process ends


def main() -> None:
    # In its own session already; a terminal's hangup or Ctrl-C must not end it before it has cleaned up.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    watch(sys.stdin)


if __name__ == "__main__":
    main()
