"""A child process the launcher owns: started in its own process group, logged to a file, health-checked, and
always stopped by PID (SIGTERM to the group, then SIGKILL), so no run leaves a server behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from agrpo.errors import LaunchError


def tail(path: Path, lines: int = 25) -> str:
    """Last lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback/config URLs only
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ManagedProcess:
    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None, log_path: Path | None = None,
                 health_url: str | None = None):
        self.name = name
        self.argv = argv
        self.env = env or {}
        self.log_path = log_path
        self.health_url = health_url
        self.popen: subprocess.Popen | None = None
        self.url: str | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, inherit_output: bool = False) -> None:
        env = {**os.environ, **self.env}
        if inherit_output or self.log_path is None:
            stdout = None
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            stdout = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.popen = subprocess.Popen(self.argv, env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as error:
            raise LaunchError(f"{self.name} could not start ({self.argv[0]}): {error}") from None
        finally:
            if stdout is not None:
                stdout.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Block until `health_url` answers 200; raise LaunchError with the log tail if the child dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise LaunchError(
                    f"{self.name} exited with code {code} before becoming healthy. Last lines of {self.log_path}:\n"
                    f"{tail(self.log_path) if self.log_path else ''}"
                )
            if self.health_url and http_ok(self.health_url):
                return
            time.sleep(poll_s)
        raise LaunchError(
            f"{self.name} was not healthy at {self.health_url} after {timeout_s:.0f} s "
            f"(inference.startup_timeout_s). Last lines of {self.log_path}:\n{tail(self.log_path) if self.log_path else ''}"
        )

    def wait(self) -> int:
        assert self.popen is not None
        return self.popen.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the child's process group, then SIGKILL it if it has not exited within `timeout_s`."""
        if self.popen is None or self.popen.poll() is not None:
            self._reap_group()
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.popen.wait(timeout=10)
        self._reap_group()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap_group(self) -> None:
        """Kill what is left of the group (e.g. vLLM's engine core outliving its API server)."""
        if self.popen is not None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
