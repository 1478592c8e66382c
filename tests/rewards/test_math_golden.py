"""Golden tests: every real gold answer in ../shared/data, written the ways models write it, scores 1; perturbed, 0.

Each set must pass at >= 99.5%. Every row of every set is checked in every form, except the GSM8K answers rewritten
as LaTeX fractions (which go through math-verify rather than the numeric fast path): all of test, every 8th of train.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agrpo.rewards.answers import gsm8k_gold, plain_number
from agrpo.rewards.math import gsm8k_accuracy, math_accuracy

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REQUIRED_RATE = 0.995


def _rows(relative: str) -> list[dict]:
    path = DATA / relative
    if not path.exists():
        pytest.fail(f"local dataset copy {path} is absent (see the project's data notes); nothing is downloaded")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _check(name: str, scores: list[float | None], expected: float, cases: list[str]) -> None:
    wrong = [case for score, case in zip(scores, cases, strict=True) if score != expected]
    rate = 1 - len(wrong) / len(scores)
    assert rate >= REQUIRED_RATE, f"{name}: {rate:.2%} scored {expected}; first misses: {wrong[:10]}"


def _gsm8k_forms(number: str) -> list[str]:
    """A GSM8K gold number as models write it: its own format, boxed, with $, commas, units, trailing .0, in prose."""
    value = plain_number(number)
    assert value is not None, number
    commas = f"{int(value):,}" if value == int(value) else number
    return [
        f"She sold 48/2 = 24 clips.\n#### {number}",
        f"So the total is 72 - 0 = {number}.\n\\boxed{{{number}}}",
        f"The answer is ${commas}.",
        f"**Answer:** {commas} dollars",
        f"Therefore she earns $\\boxed{{\\${number}.00}}$ in total.",
        f"#### {commas}.0",
        f"\\[\\boxed{{{commas} \\text{{ apples}}}}\\]",
    ]


def _gsm8k_perturbed(number: str) -> list[str]:
    value = plain_number(number)
    assert value is not None, number
    off = int(value) + 1
    return [f"#### {off}", f"\\boxed{{{number}5}}", f"The answer is {off}.", "I could not solve it."]


@pytest.mark.parametrize("split", ["train", "test"])
def test_gsm8k_gold_answers_score_one_and_perturbed_zero(split: str) -> None:
    rows = _rows(f"gsm8k/{split}.jsonl")
    numbers = [gsm8k_gold(row["answer"]) for row in rows]
    for form in range(len(_gsm8k_forms("1"))):
        cases = [_gsm8k_forms(n)[form] for n in numbers]
        golds = [row["answer"] for row in rows]  # the full solution: the reward extracts the number after ####
        _check(f"gsm8k {split} form {form}", gsm8k_accuracy(cases, answer=golds), 1.0, cases)
    for form in range(len(_gsm8k_perturbed("1"))):
        cases = [_gsm8k_perturbed(n)[form] for n in numbers]
        _check(f"gsm8k {split} perturbed {form}", gsm8k_accuracy(cases, answer=numbers), 0.0, cases)


def test_gsm8k_latex_answers_go_through_math_verify() -> None:
    rows = _rows("gsm8k/test.jsonl") + _rows("gsm8k/train.jsonl")[::8]
    numbers = [gsm8k_gold(row["answer"]) for row in rows]
    right = [f"\\boxed{{\\frac{{{int(plain_number(n)) * 2}}}{{2}}}}" for n in numbers]
    wrong = [f"\\boxed{{\\frac{{{int(plain_number(n)) * 2 + 1}}}{{2}}}}" for n in numbers]
    _check("gsm8k latex", gsm8k_accuracy(right, answer=numbers), 1.0, right)
    _check("gsm8k latex perturbed", gsm8k_accuracy(wrong, answer=numbers), 0.0, wrong)


def _math_forms(gold: str) -> list[object]:
    r"""A MATH gold answer as models write it: boxed at the end, the Minerva sentence, \dfrac, a chat message."""
    dfrac = gold.replace("\\frac", "\\dfrac")
    return [
        f"Putting it together, the answer is $\\boxed{{{gold}}}$.",
        f"Final Answer: The final answer is $\\boxed{{{gold}}}$. I hope it is correct.",
        "First try: \\boxed{-12345}. Wait, that is wrong.\n\\[\n\\boxed{" + dfrac + "}\n\\]",
        [{"role": "assistant", "content": f"<think>easy</think>\nThe answer is \\boxed{{ {gold} }}"}],
    ]


def _different(golds: list[str], i: int) -> str:
    """Another problem's gold answer, as a plausible wrong answer for problem i."""
    for step in range(1, len(golds)):
        other = golds[(i + step) % len(golds)]
        if other.replace(" ", "") != golds[i].replace(" ", ""):
            return other
    raise AssertionError("all gold answers are equal")


def _math_golden(name: str, rows: list[dict]) -> None:
    golds = [row["answer"] for row in rows]
    for form in range(len(_math_forms("1"))):
        cases = [_math_forms(g)[form] for g in golds]
        _check(f"{name} form {form}", math_accuracy(cases, answer=golds), 1.0, [str(c) for c in cases])
    others = [f"The answer is $\\boxed{{{_different(golds, i)}}}$." for i in range(len(golds))]
    _check(f"{name} other answer", math_accuracy(others, answer=golds), 0.0, others)
    numeric = [(g, plain_number(g)) for g in golds]
    numeric = [(g, v) for g, v in numeric if v is not None and "," not in g]
    plus_one = [f"\\boxed{{{v + 1:g}}}" for _, v in numeric]
    _check(f"{name} plus one", math_accuracy(plus_one, answer=[g for g, _ in numeric]), 0.0, plus_one)
    unanswered = ["Let me think about this problem. It is hard."] * len(golds)
    _check(f"{name} unanswered", math_accuracy(unanswered, answer=golds), 0.0, unanswered)


def test_sanity_gold_answers_score_one_and_perturbed_zero() -> None:
    rows = _rows("sanity/train.jsonl")
    assert all(score is not None for score in math_accuracy(["x"] * len(rows), answer=[r["answer"] for r in rows]))
    _math_golden("sanity", rows)


@pytest.mark.parametrize("year", [2024, 2025])
def test_aime_gold_answers_score_one_and_perturbed_zero(year: int) -> None:
    _math_golden(f"aime {year}", _rows(f"sanity/aime_{year}.jsonl"))
