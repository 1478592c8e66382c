"""Pure parts of evaluation: the pass@k estimator, per-problem records, the summary and the table."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agrpo.eval.scoring import (
    ProblemResult,
    is_correct,
    pass_at_k,
    render_table,
    summarize,
    term_names,
    total_rewards,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (c correct) that hold at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 1), (4, 1, 1), (4, 1, 4), (5, 2, 3), (8, 3, 2), (10, 10, 5)])
def test_pass_at_k_matches_counting_subsets(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))


@given(st.integers(1, 200), st.data())
def test_pass_at_k_properties(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the share correct
    assert value >= pass_at_k(n, c, 1) - 1e-12  # more tries never hurt
    if c == 0:
        assert value == 0.0
    if c > 0 and k == n:
        assert value == 1.0
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert value == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def result(index: int, correct: list[bool], rewards=None, truncated=None) -> ProblemResult:
    n = len(correct)
    return ProblemResult(
        index=index,
        problem=f"p{index}",
        answer="1",
        completions=["x"] * n,
        rewards=rewards if rewards is not None else [float(c) for c in correct],
        term_scores={"acc": [float(c) for c in correct]},
        correct=correct,
        truncated=truncated or [False] * n,
        completion_tokens=[10] * n,
    )


def test_summary_mean_and_pass_at_k():
    results = [result(0, [True, False, False, False]), result(1, [False] * 4), result(2, [True] * 4)]
    summary = summarize(results, k=4)
    assert summary["problems"] == 3 and summary["samples"] == 12
    assert summary["mean_at_k"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert summary["pass_at_1"] == pytest.approx(summary["mean_at_k"])
    assert summary["pass_at_k"] == pytest.approx(2 / 3)
    assert summary["problems_solved"] == 2
    assert summary["mean_reward"] == pytest.approx(5 / 12)
    assert summary["term_means"] == {"acc": pytest.approx(5 / 12)}
    assert summary["mean_at_k"] <= summary["pass_at_k"]


def test_summary_with_more_samples_than_k_uses_the_unbiased_estimator():
    summary = summarize([result(0, [True] + [False] * 7)], k=2)
    assert summary["pass_at_k"] == pytest.approx(pass_at_k(8, 1, 2)) == pytest.approx(0.25)


def test_summary_skips_unscorable_rewards_and_counts_truncation():
    summary = summarize([result(0, [False, False], rewards=[None, 0.5], truncated=[True, False])], k=2)
    assert summary["mean_reward"] == 0.5
    assert summary["truncated_fraction"] == 0.5


def test_summary_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        summarize([], k=4)


def test_total_rewards_sum_terms_and_keep_none_only_when_all_none():
    assert total_rewards([[1.0, None, None], [0.2, 0.2, None]]) == [pytest.approx(1.2), 0.2, None]


def test_term_names_are_unique():
    assert term_names(["zero_if_truncated", "boxed_format", "zero_if_truncated"]) == [
        "zero_if_truncated",
        "boxed_format",
        "zero_if_truncated#2",
    ]


def test_is_correct_threshold_and_none():
    assert is_correct(1.0, 1.0) and not is_correct(0.99, 1.0) and not is_correct(None, 0.0)


def test_problem_record_json_has_counts():
    record = result(3, [True, False]).to_json()
    assert record["index"] == 3 and record["num_correct"] == 1 and record["mean_correct"] == 0.5


def test_table_is_markdown_with_the_numbers():
    table = render_table(summarize([result(0, [True, False])], k=2), "title")
    lines = table.splitlines()
    assert lines[0] == "title"
    assert lines[2].startswith("| problems | k | mean@k | pass@1 | pass@2 |")
    assert "| 1 | 2 | 0.5000 | 0.5000 | 1.0000 |" in lines[4]
    assert "acc 0.5000" in lines[-1]
