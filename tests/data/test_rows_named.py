"""Every data error names the file and the line an editor opens (issue 42, item 5: a row with `"prompt": null` named
neither): a null, missing or wrong-typed prompt, a chat message without text, a column whose kind changes from row to
row, a null problem or answer in a math file. Blank lines hold no row, so a row's line is not its index: each file
below has one, and the line named is checked. Real files read by the loaders (`datasets`), then the CLI's dry run."""

from __future__ import annotations

from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.data import load_train_dataset
from agrpo.data.jsonl_lines import mixed_column, row_label
from agrpo.data.math import load_math_dataset
from agrpo.errors import ConfigError
from tests.processes import agrpo

GOOD = '{"prompt": "What is 2+2?", "answer": "4"}'


def jsonl(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "task.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def load(path: Path):
    cfg = compose_run_config(["+recipe=smoke", "data=jsonl", f"data.path={path}", "data.shuffle=false"])
    return load_train_dataset(cfg.data, seed=0)


CHAT = '{"prompt": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"}'


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((GOOD, "", GOOD, '{"prompt": null, "answer": "1"}'), r"the prompt is null or missing: a prompt is text or a"),
        ((GOOD, "", GOOD, '{"answer": "1"}'), r"the prompt is null or missing"),
        (("", "", "", '{"prompt": 5, "answer": "1"}'), r"a prompt must be text or a list of chat messages, got int: 5"),
        ((CHAT, "", CHAT, '{"prompt": [{"role": "user", "content": null}], "answer": "1"}'), r"a chat prompt needs"),
        ((CHAT, "", CHAT, '{"prompt": [{"role": "robot", "content": "hi"}], "answer": "1"}'), r"a chat prompt needs"),
        # a kind that changes (text, then a number, an object or a list): `datasets` cannot read the file at all
        ((GOOD, "", GOOD, '{"prompt": 5, "answer": "1"}'), r"column 'prompt' holds a number, where line 1 holds text"),
        ((GOOD, "", GOOD, '{"prompt": {"t": 1}}'), r"column 'prompt' holds an object, where line 1 holds text"),
    ],
)
def test_a_bad_prompt_names_its_file_and_line(tmp_path, lines, message):
    path = jsonl(tmp_path, *lines, lines[0])  # a good row after the bad one (or a blank line)
    with pytest.raises(ConfigError, match=rf"line 4 of {path}: {message}"):
        load(path)


def test_a_column_whose_kind_changes_names_both_lines(tmp_path):
    """pyarrow refuses it as "Expected object or value", with no line (a blank line makes `datasets` give up)."""
    path = jsonl(tmp_path, GOOD, "", '{"prompt": "b", "answer": ["4"]}')
    with pytest.raises(ConfigError) as raised:
        load(path)
    assert f"line 3 of {path}: column 'answer' holds a list, where line 1 holds text" in str(raised.value)
    assert "(the reader said: Expected object or value)" in str(raised.value)


def test_mixed_column_and_row_label_are_pure():
    text = '{"a": 1, "b": null}\n\n{"a": 2.5, "b": {"x": 1}}\n{"a": "3", "b": {}}\n'
    assert mixed_column(text, "t.jsonl") == (
        "line 4 of t.jsonl: column 'a' holds text, where line 1 holds a number; keep one kind of value per column "
        "(quote numbers as text, or wrap every row's value in a list)"
    )
    assert mixed_column('{"a": 1}\n{"a": null}\n{"b": true}\n', "t.jsonl") is None
    assert row_label("t.jsonl", [1, 3])(1) == "line 3 of t.jsonl"
    assert row_label("d.parquet", None)(1) == "row 1 of d.parquet (counting from 0)"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"question": null, "answer": "#### 2"}', r"column 'question' is null or missing"),
        ('{"question": "b", "answer": null}', r"column 'answer' is null or missing"),
        ('{"answer": "#### 2"}', r"column 'question' is null or missing"),
    ],
)
def test_a_math_row_without_a_problem_or_answer_names_its_line(tmp_path, bad, message):
    good = '{"question": "What is 1+1?", "answer": "#### 2"}'
    path = jsonl(tmp_path, good, "", bad)
    with pytest.raises(ValueError, match=rf"^line 3 of {path}: {message}$"):
        load_math_dataset(path)


def test_the_dry_run_names_the_line_of_a_null_prompt_in_one_paragraph(tmp_path):
    path = jsonl(tmp_path, GOOD, "", '{"prompt": null, "answer": "1"}')
    done = agrpo(
        "data=jsonl", f"data.path={path}", "reward=exact_match", "launcher.dry_run=true", cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"agrpo: error: invalid config (1 problem): line 3 of {path}: the prompt is null or missing: a prompt is text "
        "or a list of chat messages like [{'role': 'user', 'content': '...'}]."
    )
