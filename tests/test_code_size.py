"""Every function under 60 lines and every file under 400 in agrpo/ and benchmarks/ (read with ast, nothing is
imported): a longer one does several things that a reader has to tell apart, so it is split into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("agrpo", "benchmarks")
MAX_FUNCTION_LINES = 60  # from `def` to the function's last line, decorators and docstring included
MAX_FILE_LINES = 400

# Files allowed over the limit, each with why.
LONG_FILES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}  # "path:function" -> why


def python_files() -> list[Path]:
    return sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py"))


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method in `path` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, node.lineno, length))
    return found


def test_every_function_is_under_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in python_files()
        for name, line, length in long_functions(path)
        if f"{path.relative_to(ROOT)}:{name}" not in LONG_FUNCTIONS
    ]
    assert long == [], f"split these into named steps: {long}"


def test_every_file_is_under_400_lines():
    long = [
        f"{path.relative_to(ROOT)} ({count} lines)"
        for path in python_files()
        if (count := len(path.read_text().splitlines())) > MAX_FILE_LINES
        and str(path.relative_to(ROOT)) not in LONG_FILES
    ]
    assert long == [], f"split these by concern: {long}"


def test_the_allow_lists_name_only_what_is_still_long():
    """An entry whose file or function got short leaves the list (so it cannot hide a new long one)."""
    for name in LONG_FILES:
        assert len((ROOT / name).read_text().splitlines()) > MAX_FILE_LINES, name
    for key in LONG_FUNCTIONS:
        name, _, function = key.partition(":")
        assert function in [found for found, _, _ in long_functions(ROOT / name)], key


def test_the_finder_measures_from_def_to_the_last_line(tmp_path):
    source = tmp_path / "m.py"
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    source.write_text(f"def short():\n    return 1\n\n\nclass C:\n    async def long(self):\n{body}\n")
    assert long_functions(source) == [("long", 6, 61)]
