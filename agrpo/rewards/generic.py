r"""Rewards for your own task, written in YAML: each reads the row's gold from a dataset column you name.

TRL passes every dataset column but `prompt` to each reward as a keyword argument, one value per completion, so a
term binds the column and its options (agrpo/rewards/registry.py turns the keys into a picklable partial):

    funcs:
      - _target_: agrpo.rewards.generic.exact_match
        column: answer
        weight: 1.0

Scores are unweighted, in [0, 1]; None where the row has no usable gold (TRL leaves that sample out of the advantage).
What is compared is the completion's visible text (special-token markers removed), or the answer extracted from it:
`extract=auto` takes the last ``\boxed{}`` / ``#### x`` / "the answer is x" (agrpo/rewards/answers.py), else the last
non-empty line; `full` the whole text; `last_line`; `boxed` (the last ``\boxed{}`` only).

Columns and options share one namespace (TRL's keyword arguments win over the bound ones), so a dataset column must
not be named like an option of a reward it feeds (`column`, `extract`, `regex`, `max_len`, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from agrpo.rewards.answers import final_answer, last_boxed, plain_number
from agrpo.rewards.base import visible_text
from agrpo.rewards.math import gsm8k_score

EXTRACT_MODES = ("auto", "full", "last_line", "boxed")
LENGTH_UNITS = ("tokens", "chars", "words")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def column_values(columns: dict[str, Any], column: str, n: int, reward: str) -> list[Any]:
    """The named column's value per completion; a missing column names the columns that did arrive."""
    if column not in columns:
        arrived = sorted(k for k in columns if k not in ("prompts", "completion_ids"))
        raise KeyError(
            f"reward {reward} reads column {column!r}, but the dataset rows hold {arrived}: set the "
            f"term's `column:` or rename a column with data.columns"
        )
    values = columns[column]
    if isinstance(values, (str, int, float)) or values is None:  # one value for a hand-written call
        return [values] * n
    if len(values) != n:
        raise ValueError(f"reward {reward}: {len(values)} values of column {column!r} for {n} completions")
    return list(values)


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def extract_answer(text: str, extract: str = "auto") -> str | None:
    """The part of a completion's text that is compared with the gold (see the module docstring)."""
    if extract == "full":
        return text.strip()
    if extract == "last_line":
        return _last_line(text)
    if extract == "boxed":
        found = last_boxed(text)
        return found[0] if found else None
    if extract == "auto":
        return final_answer(text) or _last_line(text)
    raise ValueError(f"extract={extract!r}: use one of {', '.join(EXTRACT_MODES)}")


def normalize(text: str, case_sensitive: bool = False) -> str:
    """Whitespace collapsed, a trailing period and surrounding quotes or markdown bold dropped, case folded."""
    text = " ".join(str(text).split()).strip().strip("*\"'`").rstrip(".").strip()
    return text if case_sensitive else text.casefold()


def _golds(gold: Any) -> list[Any]:
    """A gold value or a list of accepted ones."""
    return list(gold) if isinstance(gold, (list, tuple)) else [gold]


def exact_match(
    completions: list[Any], column: str = "answer", extract: str = "auto", case_sensitive: bool = False, **columns: Any
) -> list[float | None]:
    """1.0 when the extracted answer equals the row's gold (or one of a list of golds) after `normalize`."""
    golds = column_values(columns, column, len(completions), "exact_match")
    scores: list[float | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        accepted = {normalize(g, case_sensitive) for g in _golds(gold) if g is not None and str(g).strip()}
        if not accepted:
            scores.append(None)
            continue
        answer = extract_answer(visible_text(completion), extract)
        scores.append(float(answer is not None and normalize(answer, case_sensitive) in accepted))
    return scores


def regex_match(
    completions: list[Any],
    regex: str | None = None,
    column: str | None = None,
    extract: str = "full",
    fullmatch: bool = False,
    ignore_case: bool = False,
    **columns: Any,
) -> list[float | None]:
    """1.0 when the (extracted) completion matches a regex: `regex` for every row, or each row's own in `column`.

    With `regex` alone it is a format term (e.g. ``"^<think>.+</think>"``); searched anywhere unless `fullmatch`.
    """
    if (regex is None) == (column is None):
        raise ValueError("regex_match: set exactly one of `regex` (one for every row) or `column` (a regex per row)")
    n = len(completions)
    patterns = [regex] * n if column is None else column_values(columns, column, n, "regex_match")
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    scores: list[float | None] = []
    for completion, row_regex in zip(completions, patterns, strict=True):
        if row_regex is None:
            scores.append(None)
            continue
        text = extract_answer(visible_text(completion), extract)
        matcher = re.compile(str(row_regex), flags)
        hit = text is not None and (matcher.fullmatch(text) if fullmatch else matcher.search(text))
        scores.append(float(bool(hit)))
    return scores


def as_number(value: Any) -> float | None:
    """A gold or an answer as a number: ints and floats as they are, text through `plain_number` ($, 1,000, 25%)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return plain_number(str(value))


def _answer_number(text: str, extract: str) -> float | None:
    """The extracted answer as a number; with `auto`, the last number in the text when no marked answer is one."""
    answer = extract_answer(text, extract)
    number = as_number(answer) if answer is not None else None
    if number is None and extract == "auto":
        found = _NUMBER.findall(text)
        number = as_number(found[-1]) if found else None
    return number


def numeric_match(
    completions: list[Any],
    column: str = "answer",
    rel_tol: float = 0.0,
    abs_tol: float = 1e-6,
    extract: str = "auto",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the completion's answer is a number within `abs_tol` or `rel_tol` of the row's numeric gold."""
    golds = column_values(columns, column, len(completions), "numeric_match")
    scores: list[float | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        target = as_number(gold)
        if target is None:
            scores.append(None)
            continue
        number = _answer_number(visible_text(completion), extract)
        close = number is not None and math.isclose(number, target, rel_tol=rel_tol, abs_tol=abs_tol)
        scores.append(float(close))
    return scores


def math_equivalent(completions: list[Any], column: str = "answer", **columns: Any) -> list[float | None]:
    r"""1.0 when the final answer (``\boxed{}``, ``#### x`` or stated) equals the gold: numerically for plain numbers,
    by math-verify for anything else (``\frac{1}{2}`` = 0.5). The math recipes' logic (agrpo.rewards.math)."""
    golds = column_values(columns, column, len(completions), "math_equivalent")
    return [
        None if gold is None else gsm8k_score(visible_text(c), str(gold))
        for c, gold in zip(completions, golds, strict=True)
    ]


def _length(completion: Any, ids: Sequence[int] | None, unit: str) -> int:
    if unit == "tokens":
        if ids is None:
            raise ValueError("length_within(unit=tokens) needs completion_ids (TRL passes them); use unit=chars")
        return len(ids)
    text = visible_text(completion)
    return len(text) if unit == "chars" else len(text.split())


def length_within(
    completions: list[Any],
    completion_ids: list[Any] | None = None,
    max_len: int | None = None,
    min_len: int = 0,
    unit: str = "tokens",
    **columns: Any,
) -> list[float]:
    """1.0 when the completion's length (tokens, chars or words) lies in [min_len, max_len], else 0.0.

    A length term: a small positive weight pays for staying in range, a negative one on `min_len` alone penalises
    rambling. `max_len` None: no upper bound.
    """
    if unit not in LENGTH_UNITS:
        raise ValueError(f"length_within: unit={unit!r}, use one of {', '.join(LENGTH_UNITS)}")
    ids_per = completion_ids if completion_ids is not None else [None] * len(completions)
    scores = []
    for completion, ids in zip(completions, ids_per, strict=True):
        length = _length(completion, ids, unit)
        scores.append(float(length >= min_len and (max_len is None or length <= max_len)))
    return scores
