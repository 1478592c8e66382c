"""A child process the launcher owns: started in its own process group, logged to a file, health-checked, and
always stopped by PID (SIGTERM to the group, then SIGKILL), so no run leaves a server behind.

Every child carries the run's marker (AGRPO_RUN_TOKEN) and its group is handed to the launcher's watchdog
(agrpo/processes/watchdog.py), which stops it if the launcher dies without doing so itself. "Healthy" means the
health URL answers 200 AND the socket listening on its port belongs to the child's own process group: another
run's server on the same port does not count.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agrpo.errors import LaunchError
from agrpo.processes.ports import listener_owned_by
from agrpo.processes.watchdog import RUN_TOKEN_ENV, WATCHDOG, group_is_ours, group_members, run_token, start_time

log = logging.getLogger(__name__)


def tail(path: Path, lines: int = 25) -> str:
    """Last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback/config URLs only
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        health_url: str | None = None,
    ):
        self.name = name
        self.argv = argv
        self.env = env or {}
        self.log_path = log_path
        self.health_url = health_url
        self.popen: subprocess.Popen | None = None
        self.url: str | None = None
        self.leader_start: int | None = None  # the child's start time: tells its group from a later one with its id

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, inherit_output: bool = False) -> None:
        """Start (or restart) the child. A restart first kills what is left of the previous group (a replica whose
        API server died can leave its engine core behind)."""
        if self.popen is not None:
            self._reap_group()
        env = {**os.environ, **self.env, RUN_TOKEN_ENV: run_token()}
        if inherit_output or self.log_path is None:
            stdout = None
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            stdout = open(self.log_path, "ab")  # handed to the child, closed below
        try:
            self.popen = subprocess.Popen(
                self.argv,
                env=env,
                stdout=stdout,
                stderr=subprocess.STDOUT if stdout else None,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:
            raise LaunchError(f"{self.name} could not start ({self.argv[0]}): {error}") from None
        finally:
            if stdout is not None:
                stdout.close()
        self.leader_start = start_time(self.popen.pid)
        WATCHDOG.watch(self.popen.pid, self.leader_start)  # start_new_session: the child's pid is its process group

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The child's exit code once it has exited (None while it runs or before it starts)."""
        return self.popen.poll() if self.popen is not None else None

    def serves_its_port(self) -> bool:
        """Whether the socket listening on the health URL's port is held by this child's process group (True where
        /proc cannot tell)."""
        port = urlparse(self.health_url).port if self.health_url else None
        if port is None or self.popen is None:
            return True
        return listener_owned_by(port, group_members(self.popen.pid)) is not False

    def _port_taken_hint(self, log_tail: str) -> str:
        """agrpo runs never share a port (ports.py locks), but a program outside agrpo may bind it between the check
        and the child's own bind."""
        if "Address already in use" not in log_tail:
            return ""
        port = urlparse(self.health_url).port if self.health_url else None
        return (
            f" Port {port} was taken by another program after agrpo found it free: run again (the next free port "
            "is picked), or move inference.base_port to a range nothing else uses."
        )

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0, check: Callable[[], None] | None = None) -> None:
        """Block until `health_url` answers 200 from this child's own socket; raise LaunchError with the log tail if
        the child dies or times out. `check` runs at every poll and may raise (a trainer started meanwhile died)."""
        deadline = time.monotonic() + timeout_s
        impostor = False
        while time.monotonic() < deadline:
            if check is not None:
                check()
            if not self.alive():
                code = self.exit_code
                log_tail = tail(self.log_path) if self.log_path else ""
                raise LaunchError(
                    f"{self.name} exited with code {code} before becoming healthy.{self._port_taken_hint(log_tail)} "
                    f"Last lines of {self.log_path}:\n{log_tail}"
                )
            if self.health_url and http_ok(self.health_url):
                if self.serves_its_port():
                    return
                impostor = True  # another process answers on our port; ours will fail to bind, or bind later
            time.sleep(poll_s)
        other = (
            (f" Another process, not {self.name}, answers on {self.health_url}: another run or program holds the port.")
            if impostor
            else ""
        )
        raise LaunchError(
            f"{self.name} was not healthy at {self.health_url} after {timeout_s:.0f} s "
            f"(inference.startup_timeout_s).{other} Last lines of {self.log_path}:\n"
            f"{tail(self.log_path) if self.log_path else ''}"
        )

    def wait(self) -> int:
        assert self.popen is not None
        return self.popen.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the child's process group, then SIGKILL it if it has not exited within `timeout_s`."""
        stop_all([self], timeout_s)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap_group(self) -> None:
        """Kill what is left of the group (e.g. vLLM's engine core outliving its API server), then tell the watchdog
        the group is no longer ours to watch."""
        if self.popen is not None:
            if group_is_ours(self.popen.pid, self.leader_start):
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            WATCHDOG.forget(self.popen.pid)


def stop_all(processes: Sequence[ManagedProcess], timeout_s: float = 20.0) -> None:
    """Stop several children at once: SIGTERM every group, one shared wait of `timeout_s`, SIGKILL the rest. (One at a
    time, a run with three replicas could take three grace periods to stop.)"""
    running = [p for p in processes if p.popen is not None and p.popen.poll() is None]
    for process in running:
        process._signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in running:
        try:
            process.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            log.warning(
                "%s did not exit within %.0f s of SIGTERM (launcher.stop_timeout_s); killed it", process.name, timeout_s
            )
            process._signal_group(signal.SIGKILL)
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (D state) or its pid not ours to reap: the watchdog is told
                log.warning("%s did not exit within 10 s of SIGKILL", process.name)
    for process in processes:
        process._reap_group()


class Stopped(KeyboardInterrupt):
    """A signal asked the run to stop (Ctrl-C, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signame = signal.Signals(signum).name


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalGuard:
    """While the run is up, SIGINT/SIGTERM/SIGHUP raise `Stopped` once; from then on (and during any teardown) they
    are noted and ignored, so a second Ctrl-C cannot cut the teardown short and leave replicas running."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.tearing_down = False
        self.told = False

    def __enter__(self) -> SignalGuard:
        for sig in STOP_SIGNALS:
            try:
                self.previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: signals are not ours to handle
                break
        return self

    def teardown(self) -> None:
        self.tearing_down = True

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.tearing_down:
            self.tearing_down = True
            raise Stopped(signum)
        if not self.told:
            self.told = True
            try:  # after SIGHUP the terminal may be gone
                os.write(
                    2,
                    f"agrpo: {signal.Signals(signum).name} again: still stopping the run's processes, "
                    "please wait (they are stopped, never abandoned)\n".encode(),
                )
            except OSError:
                pass

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
