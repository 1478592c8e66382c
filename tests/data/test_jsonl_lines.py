"""A JSONL file's rows and their lines (agrpo/data/jsonl_lines.py): pure, on text."""

from __future__ import annotations

import pytest

from agrpo.data.jsonl_lines import row_lines


def test_each_row_has_its_line_and_blank_lines_hold_none():
    text = '{"prompt": "a"}\n\n  \n{"prompt": "b"}\r\n{"prompt": "c"}'
    assert row_lines(text, "t.jsonl") == [1, 4, 5]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a"}\n{"prompt": "b", "ans\n', r"^line 2 of t.jsonl is not valid JSON \(.*, column \d+\): "),
        ('{"prompt": "a"}\n["a", "b"]\n', r"^line 2 of t.jsonl holds a JSON list, not an object"),
        ('{"prompt": "a"} {"prompt": "b"}\n', r"^line 1 of t.jsonl is not valid JSON \(Extra data, column 17\)"),
        ("", r"^t.jsonl is empty: a JSONL file holds one JSON object per line"),
        ("\n\n", r"^t.jsonl holds only blank lines"),
    ],
)
def test_a_bad_line_or_an_empty_file_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        row_lines(text, "t.jsonl")


def test_a_long_bad_line_is_shown_short():
    with pytest.raises(ValueError) as raised:
        row_lines('{"prompt": "' + "x" * 500, "t.jsonl")
    assert len(str(raised.value)) < 300 and "...'" in str(raised.value)
