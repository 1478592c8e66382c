"""Run a script under benchmarks/ as a user would (`python benchmarks/X.py ARGS` from the checkout) and read the table
it prints: the checks of tests/benchmarks/ that every benchmark still runs and still prints its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"\d+(?:\.\d+)?")  # a figure, with or without its unit (`1.02x`, `17%`, `0.3 s`)


def run_script(script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """stdout of `python benchmarks/<script> ARGS` run from the checkout; fails with its output when it fails."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    assert done.returncode == 0, (
        f"{script} {' '.join(args)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    )
    return done.stdout


def table_rows(output: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line contains `header`: the header, a `|---|` line, then rows
    until the first line that is not a row. Fails naming the header when there is none or it has no rows."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|") and header in line), None)
    assert start is not None, f"no table headed {header!r} in:\n{output[-3000:]}"
    assert re.fullmatch(r"\|[-:| ]+\|", lines[start + 1].strip()), lines[start : start + 2]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert rows, f"the table headed {header!r} has no rows:\n{output[-3000:]}"
    return rows


def has_number(cells: list[str]) -> bool:
    """Whether a row holds at least one figure (not only labels or dashes)."""
    return any(NUMBER.search(cell) for cell in cells[1:])
