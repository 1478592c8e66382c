"""A second local user for tests/processes/: real processes running as uid/gid 65534 (nobody), started from the tests'
root. They use no agrpo code (a hostile user brings their own), only the standard library. Tests that use them are
marked to fail, never skip, where the suite does not run as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

NOBODY = 65534
NEEDS_ROOT = (
    "needs root and setpriv (util-linux), to run a second user (uid 65534) against the run"
    if os.geteuid() != 0 or shutil.which("setpriv") is None
    else None
)
# setpriv, not subprocess's user=: here the latter cannot exec an interpreter that lives under /root (pyenv)
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def as_nobody(code: str, *args: str) -> str:
    """Run `code` (Python) as uid 65534 with `args` in sys.argv; its stdout. A failure is the test's failure."""
    done = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def start_as_nobody(code: str, *args: str) -> subprocess.Popen:
    """`code` as uid 65534, left running; it prints one line once ready (read it with .stdout.readline())."""
    return subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


class SharedDir:
    """A world-writable sticky directory like /tmp (root-owned, 1777) that both users can reach, removed afterwards;
    pytest's tmp_path is under a 0700 directory the second user cannot enter."""

    def __init__(self):
        self.path = Path(tempfile.mkdtemp(prefix="agrpo-hostile-", dir="/tmp"))
        os.chmod(self.path, 0o1777)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def tree(path: Path) -> list[str]:
    """Every name under `path`, links not followed (what a run created there)."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))
