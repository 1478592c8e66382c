"""Unit tests of the math rewards: answer extraction, scoring, threads, pickling, truncation and the format reward."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import pickle
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrpo.rewards.answers import final_answer, gsm8k_gold, last_boxed, last_hash_answer, plain_number, stated_answer
from agrpo.rewards.base import WeightedReward
from agrpo.rewards.math import TruncationAware, boxed_format, gsm8k_accuracy, math_accuracy, zero_if_truncated


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}} and then \boxed{\frac{3}{4}}.", r"\frac{3}{4}"),
        (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
        (r"\fbox{7}", "7"),
        (r"the answer is \boxed 5.", "5"),
        (r"\boxed{unclosed", None),
        ("no box here", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    found = last_boxed(text)
    assert (found[0] if found else None) == expected


def test_hash_marker_ignores_markdown_headers() -> None:
    assert last_hash_answer("#### Step 1: add\n3 + 4 = 7\n#### 7") == ("7", 27)
    assert last_hash_answer("#### Step 2: done") is None
    assert last_hash_answer("so #### $1,000.") == ("$1,000.", 3)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 72.", "72"),
        ("The answer is 0.5 because", "0.5 because"),
        ("**Answer:** 72 clips", "72 clips"),
        (r"The final answer is $\frac{1}{2}$. I hope it is correct.", r"\frac{1}{2}"),
        (r"answer is \(x^2\)", "x^2"),
        ("nothing stated", None),
    ],
)
def test_stated_answer(text: str, expected: str | None) -> None:
    assert stated_answer(text) == expected


def test_final_answer_takes_the_later_marker_and_refuses_long_answers() -> None:
    assert final_answer(r"\boxed{3} no wait" + "\n#### 4") == "4"
    assert final_answer("#### 4\nActually \\boxed{5}") == "5"
    assert final_answer(r"\boxed{" + "1+" * 200 + "1}") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("72", 72.0),
        ("1,080", 1080.0),
        ("1{,}080", 1080.0),
        (r"\$1\,080.00", 1080.0),
        ("-3", -3.0),
        ("25%", 25.0),
        (r"18 \text{ dollars}", 18.0),
        ("72.", 72.0),
        (".5", 0.5),
        (r"\frac{1}{2}", None),
        ("2+3", None),
        ("x = 5", None),
        ("5 apples and 3 pears", None),
    ],
)
def test_plain_number(text: str, expected: float | None) -> None:
    assert plain_number(text) == expected


def test_gsm8k_gold_reads_the_number_after_the_marker() -> None:
    assert gsm8k_gold("48/2 = <<48/2=24>>24\n#### 1,080") == "1,080"
    assert gsm8k_gold(" 72 ") == "72"


def test_gsm8k_accuracy_reads_strings_and_chat_messages() -> None:
    completions = [
        "#### 72",
        [{"role": "assistant", "content": r"It is $\boxed{72}$"}],
        "#### 71",
        "no answer at all",
    ]
    assert gsm8k_accuracy(completions, answer=["...\n#### 72"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_unparseable_gold_is_unscorable() -> None:
    assert gsm8k_accuracy(["#### 3", "#### 3"], answer=["", None]) == [None, None]
    assert math_accuracy([r"\boxed{3}", r"\boxed{3}"], answer=[" ", None]) == [None, None]


def test_math_accuracy_equivalences() -> None:
    completions = [r"\boxed{25}", r"\boxed{0.5}", r"\boxed{\dfrac12}", r"\boxed{[1, 2)}", r"\boxed{(1, 2)}"]
    golds = ["025", r"\frac{1}{2}", r"\frac{1}{2}", "[1,2)", "[1,2)"]
    assert math_accuracy(completions, answer=golds) == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_missing_or_mismatched_golds_are_errors() -> None:
    with pytest.raises(ValueError, match="'answer' column"):
        math_accuracy(["x"])
    with pytest.raises(ValueError, match="2 gold answers for 1"):
        math_accuracy(["x"], answer=["1", "2"])


@pytest.mark.parametrize("bomb", [r"10^{10^{10^{10}}}", "100!!!", r"e^{e^{e^{100}}}", r"9^{9^{9}}"])
def test_answers_that_would_stall_sympy_score_zero_without_being_compared(bomb: str, monkeypatch) -> None:
    import math_verify

    compared = []
    real_verify = math_verify.verify
    monkeypatch.setattr(math_verify, "verify", lambda *a, **k: compared.append(a) or real_verify(*a, **k))
    scores: list = []
    worker = threading.Thread(target=lambda: scores.append(math_accuracy([rf"\boxed{{{bomb}}}"], answer=["3"])))
    worker.start()
    worker.join(timeout=120)  # a bound on a stall (sympy would take hours), not a measurement
    assert not worker.is_alive() and scores == [[0.0]]
    assert compared == []  # refused before sympy was asked to compare it


def test_rewards_run_outside_the_main_thread() -> None:
    """TRL scores through asyncio.to_thread; math-verify's signal timeouts would raise there."""
    results: list[object] = []

    def score() -> None:
        try:
            results.append(math_accuracy([r"\boxed{\frac{2}{4}}", r"\boxed{3}"], answer=[r"\frac12", "4"]))
        except Exception as error:  # pragma: no cover - the failure this test exists to catch
            results.append(error)

    thread = threading.Thread(target=score)
    thread.start()
    thread.join()
    assert results == [[1.0, 0.0]]
    to_thread = asyncio.run(asyncio.to_thread(gsm8k_accuracy, completions=[r"\boxed{\frac{144}{2}}"], answer=["72"]))
    assert to_thread == [1.0]


def _score_in_child(reward: object) -> list[float | None]:
    return reward(completions=[r"\boxed{1,000}"], completion_ids=[[1, 2]], answer=["#### 1000"])


def test_rewards_pickle_and_score_in_a_spawned_process() -> None:
    reward = WeightedReward(TruncationAware(gsm8k_accuracy, max_completion_length=8), weight=0.5)
    assert pickle.loads(pickle.dumps(reward))(completions=["#### 2"], completion_ids=[[1]], answer=["2"]) == [0.5]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_score_in_child, (reward,)) == [0.5]


def test_truncation_zeroes_completions_cut_at_the_limit() -> None:
    completions = ["#### 5", "#### 5", "#### 5", "#### 5"]
    ids = [[7, 8, 9, 2], [7, 8, 9, 9], [7, 9], [7, 8, 9, 9, 9]]
    with_eos = TruncationAware(gsm8k_accuracy, max_completion_length=4, eos_token_ids=[2])
    assert with_eos(completions=completions, completion_ids=ids, answer=["5"] * 4) == [1.0, 0.0, 1.0, 0.0]
    by_length = TruncationAware("agrpo.rewards.math.gsm8k_accuracy", max_completion_length=4)
    assert by_length(completions=completions, completion_ids=ids, answer=["5"] * 4) == [0.0, 0.0, 1.0, 0.0]
    assert by_length(completions=completions, answer=["5"] * 4) == [1.0] * 4
    assert by_length(completions=["#### 5"], completion_ids=[[1, 1, 1, 1]], answer=[""]) == [None]
    assert by_length.__name__ == "gsm8k_accuracy"
    with pytest.raises(ValueError, match="positive"):
        TruncationAware(gsm8k_accuracy, max_completion_length=0)
    bound = functools.partial(zero_if_truncated, reward="agrpo.rewards.math.gsm8k_accuracy", max_completion_length=4)
    bound = pickle.loads(pickle.dumps(bound))
    assert bound(completions=completions, completion_ids=ids, answer=["5"] * 4) == [0.0, 0.0, 1.0, 0.0]


def test_boxed_format() -> None:
    chat = [{"role": "assistant", "content": "#### 4"}]
    completions = [r"so \boxed{4}", "#### 4", r"\boxed{}", "The answer is 4.", chat]
    assert boxed_format(completions) == [1.0, 1.0, 0.0, 0.0, 1.0]


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_any_gsm8k_integer_in_any_common_form(n: int) -> None:
    forms = [f"#### {n}", f"#### {n:,}", rf"\boxed{{{n:,}}}", f"The answer is {n}.0.", rf"\boxed{{\${n:,}}}"]
    assert gsm8k_accuracy(forms, answer=[f"#### {n}"] * len(forms)) == [1.0] * len(forms)
    assert gsm8k_accuracy([f"#### {n + 1}"], answer=[str(n)]) == [0.0]
