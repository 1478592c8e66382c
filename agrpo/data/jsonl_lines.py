"""A JSONL file read line by line before `datasets` reads it: a broken line or an empty file is named with the file and
its line, and each row's line number is known, so a problem found in row N is shown at the line an editor opens.

`datasets` (pyarrow) reports a truncated line as "Expected object or value at position 30" with no line, an empty file
as a bare StopIteration, and skips blank lines, so a row's index is not its line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

_SHOWN = 80


def row_lines(text: str, path: str | Path) -> list[int]:
    """The 1-based line number of each row of a JSONL text (blank lines hold no row); ValueError naming the file and
    the line for a line that is not one JSON object, or for a file with no row at all (pure)."""
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            shown = line if len(line) <= _SHOWN else line[: _SHOWN - 3] + "..."
            raise ValueError(
                f"line {number} of {path} is not valid JSON ({error.msg}, column {error.colno}): {shown!r}; a JSONL "
                "file holds one JSON object per line"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"line {number} of {path} holds a JSON {type(value).__name__}, not an object; a JSONL file holds one "
                'JSON object per line, like {"prompt": "...", "answer": "..."}'
            )
        lines.append(number)
    if not lines:
        what = "is empty" if not text else "holds only blank lines"
        raise ValueError(f"{path} {what}: a JSONL file holds one JSON object per line, one line per training row")
    return lines


def jsonl_row_lines(path: str | Path) -> list[int]:
    """`row_lines` of a file (ValueError as there; one that is not UTF-8 text is named too)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {error.start}): a JSONL file is UTF-8 JSON, one object per line"
        ) from None
    return row_lines(text, path)


def row_label(path: str | Path, lines: list[int] | None) -> Callable[[int], str]:
    """How an error names row `index` of a file's rows as loaded: its line (`lines`, from `row_lines`) where known, else
    its index (pure)."""
    if lines is None:
        return lambda index: f"row {index} of {path} (counting from 0)"
    return lambda index: f"line {lines[index]} of {path}" if index < len(lines) else f"row {index} of {path}"


_KINDS = {dict: "an object", list: "a list", str: "text", bool: "a boolean", int: "a number", float: "a number"}


def mixed_column(text: str, path: str | Path) -> str | None:
    """The first line whose column holds another kind of JSON value (object, list, text, number, boolean) than the
    first row that has it, as a sentence naming both lines; None when every column keeps one kind (pure). For a file
    `datasets` could not read: its error names no line."""
    first: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        for column, value in row.items() if isinstance(row, dict) else ():
            if value is None:
                continue
            kind = _KINDS.get(type(value), type(value).__name__)
            seen = first.setdefault(column, (kind, number))
            if seen[0] != kind:
                return (
                    f"line {number} of {path}: column {column!r} holds {kind}, where line {seen[1]} holds {seen[0]}; "
                    "keep one kind of value per column (quote numbers as text, or wrap every row's value in a list)"
                )
    return None
