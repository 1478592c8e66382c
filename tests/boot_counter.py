"""The vLLM boot budget (issue 29, docs/ci.md): every vLLM start in the test session is counted, by test file, and the
session fails when a file boots more often than docs/ci.md's boot table says.

A boot is a new vLLM engine core: the process vLLM renames "VLLM::EngineCore" (/proc/<pid>/comm keeps 15 characters),
one per replica start, whoever starts it (the session's shared server, a launcher, a rehearsed Job). A thread polls
/proc while a test marked `vllm` runs and charges each new engine core to that test's file; the session-wide
`vllm_server` fixture charges its one boot to itself. A start that dies within the poll interval is not seen: the
budget is about the boots that cost time.
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from pathlib import Path

from tests.processes import comm

ENGINE_CORE = "VLLM::EngineCor"
SHARED = "vllm_server (conftest.py)"
POLL_S = 0.25
# | `tests/e2e/x.py` | 2 | ... (a test file's path from the checkout's root, or the shared server's row)
BOOT_ROW = re.compile(r"^\|\s*`(tests/[^`]+|vllm_server \(conftest\.py\))`\s*\|\s*(\d+)\s*\|", re.M)


def documented_boots(ci_doc: Path) -> dict[str, int]:
    """docs/ci.md's boot table: test file (or the shared fixture) -> vLLM boots per CI run."""
    return {name: int(count) for name, count in BOOT_ROW.findall(ci_doc.read_text())}


def over_budget(counted: Counter, documented: dict[str, int]) -> list[str]:
    """One line per file that booted vLLM more often than docs/ci.md says (or is not in its table at all)."""
    return [
        f"{name}: {count} vLLM boot(s), docs/ci.md's boot table says {documented.get(name, 0)}"
        for name, count in sorted(counted.items())
        if count > documented.get(name, 0)
    ]


def parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is among `pid`'s parents: only this session's boots count, not another session's on the
    same machine (a developer's second pytest, a benchmark)."""
    seen = 0
    while pid > 1 and seen < 64:
        pid, seen = parent(pid), seen + 1
        if pid == ancestor:
            return True
    return False


def engine_cores() -> set[int]:
    """The engine cores started under this process (see `descends_from`). A process named like an engine core whose
    parent is one is that engine's fork on its way to exec (its name is the parent's until then), not a boot: since a
    replica's engine core runs the model itself (agrpo/inference/vllm_server.py:pinned_engine_env), what it forks
    carries its name for that moment."""
    found = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and comm(int(entry)) == ENGINE_CORE:
            pid = int(entry)
            if comm(parent(pid)) != ENGINE_CORE and descends_from(pid, me):
                found.add(pid)
    return found


class BootCounter:
    """Counts new engine cores and charges them to `owner` (a test file, or SHARED while the shared server starts)."""

    def __init__(self):
        self.counted: Counter = Counter()
        self.owner: str | None = None
        self._seen = engine_cores()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="vllm-boot-counter", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            self.sample()

    def sample(self) -> None:
        now = engine_cores()
        new = now - self._seen
        if new and self.owner is not None:
            self.counted[self.owner] += len(new)
        # Every engine core seen this session, not only the latest sample's: one that left a sample and came back
        # (a /proc read that failed under load, its parent chain unreadable for a moment) is not a new boot. A CI run
        # counted 7 boots for tests/launchers/test_hygiene.py whose six replica logs held one engine start each.
        self._seen |= now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
