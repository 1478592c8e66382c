"""No skip goes unnoticed (issue 42): a session fails when a test skips (skip, skipif, xfail, importorskip, a module
skipped at collection) that tests/allowed_skips.toml does not list, or whose listed condition does not hold here.

A green CI run must mean every test ran, except the few that cannot run on this kind of machine by design (the GPU
count, the huggingface_hub line of the GPU-versions lane); those are listed with their reason and the condition
under which they may skip, and the condition is checked, so a skip that spreads (a library rename turning a skipif
on, a module-level importorskip after an install broke) fails the run naming the test and the file to edit.

The hook is a plugin object (tests/conftest.py registers it); `judge` is the pure part. Under xdist the controller
judges: it receives every worker's reports.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ALLOW_LIST = REPO / "tests" / "allowed_skips.toml"
GPU_VERSIONS_PINS = REPO / "constraints" / "gpu-versions.txt"


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str
    kind: str  # "skip" (skip, skipif, importorskip, a module skipped at collection) or "xfail"


@dataclass(frozen=True)
class Entry:
    tests: str  # a node id, or a prefix of node ids ending in `*` (`tests/e2e/test_agent.py::*`)
    reason: str
    when: str  # a condition's name (CONDITIONS)

    def covers(self, nodeid: str) -> bool:
        return nodeid.startswith(self.tests[:-1]) if self.tests.endswith("*") else nodeid == self.tests


def visible_gpus() -> int:
    from tests.gpu_count import visible_gpus as count

    return count()


def pinned_hub_version(pins: Path = GPU_VERSIONS_PINS) -> str | None:
    """The huggingface_hub version constraints/gpu-versions.txt pins (the documented 1.x line), or None."""
    found = re.search(r"^huggingface_hub==(\S+)", pins.read_text(), re.M) if pins.is_file() else None
    return found[1] if found else None


def hub_is_the_pinned_1x_line() -> bool:
    import huggingface_hub

    installed = huggingface_hub.__version__
    return installed.split(".")[0] == "1" and installed == pinned_hub_version()


# The conditions an allow-list entry may name: each says when, on which machine or in which lane, the skip is right.
CONDITIONS: dict[str, Callable[[], bool]] = {
    "fewer than 3 GPUs": lambda: visible_gpus() < 3,
    "a GPU machine with 1 or 2 GPUs": lambda: 0 < visible_gpus() < 3,
    "huggingface_hub is the 1.x line constraints/gpu-versions.txt pins": hub_is_the_pinned_1x_line,
    "outside make test-gpu-versions": lambda: os.environ.get("AGRPO_PINNED_ENV") != "1",
}


def load_entries(text: str, known: Iterable[str]) -> tuple[list[Entry], list[str]]:
    """The allow-list's entries, and one line per malformed one (a missing key, a condition no one defined)."""
    entries, problems = [], []
    for number, raw in enumerate(tomllib.loads(text).get("skip", []), start=1):
        missing = [key for key in ("tests", "reason", "when") if not str(raw.get(key, "")).strip()]
        if missing:
            problems.append(f"entry {number} lacks {', '.join(missing)}")
        elif raw["when"] not in known:
            problems.append(
                f"entry {number} ({raw['tests']}): no condition named {raw['when']!r} (known: {sorted(known)})"
            )
        else:
            entries.append(Entry(raw["tests"], raw["reason"], raw["when"]))
    return entries, problems


def judge(skips: Iterable[Skip], entries: list[Entry], holds: Callable[[str], bool], allow_list: str) -> list[str]:
    """One line per skip that may not happen here: unlisted, or listed under a condition that does not hold."""
    lines = []
    for skip in skips:
        entry = next((e for e in entries if e.covers(skip.nodeid)), None)
        if entry is None:
            lines.append(
                f"unlisted {skip.kind}: {skip.nodeid} ({skip.reason}): make it run, or list it with its reason "
                f"and condition in {allow_list}"
            )
        elif not holds(entry.when):
            lines.append(
                f"{skip.kind} outside its condition: {skip.nodeid} ({skip.reason}), but {entry.when!r} does not "
                f"hold here ({allow_list})"
            )
    return lines


def skip_reason(report) -> str:
    if getattr(report, "wasxfail", None) is not None:
        return report.wasxfail or "xfail"
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    """The pytest plugin: collects every skip of the session and fails the session on one the list does not allow."""

    def __init__(self, allow_list: Path = ALLOW_LIST, conditions: dict[str, Callable[[], bool]] = CONDITIONS):
        self.allow_list, self.conditions = allow_list, conditions
        self.skips: list[Skip] = []
        self.lines: list[str] = []

    def record(self, report, nodeid: str) -> None:
        xfail = getattr(report, "wasxfail", None) is not None
        if report.skipped or xfail:
            self.skips.append(Skip(nodeid, skip_reason(report), "xfail" if xfail else "skip"))

    def pytest_collectreport(self, report) -> None:
        self.record(report, report.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.skipped:  # an xfail's setup/teardown passes; its call says it
            self.record(report, report.nodeid)

    def pytest_sessionfinish(self, session) -> None:
        if hasattr(session.config, "workerinput") or not self.skips:  # an xdist worker: the controller judges
            return
        shown = os.path.relpath(self.allow_list)
        entries, problems = load_entries(self.allow_list.read_text(), self.conditions)
        verdicts: dict[str, bool] = {}

        def holds(when: str) -> bool:
            if when not in verdicts:
                verdicts[when] = bool(self.conditions[when]())
            return verdicts[when]

        self.lines = [f"{shown}: {problem}" for problem in problems]
        self.lines += judge(dict.fromkeys(self.skips), entries, holds, shown)
        if self.lines and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.lines:
            terminalreporter.section("skips the allow-list does not allow (tests/skip_policy.py)", red=True)
        for line in self.lines:
            terminalreporter.write_line(line, red=True)
