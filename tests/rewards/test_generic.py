"""Generic YAML rewards: each reads the gold from a named column; the registry builds them picklable, from YAML, a
module in the working directory or a file path."""

from __future__ import annotations

import pickle

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.errors import ConfigError
from agrpo.rewards.generic import (
    exact_match,
    extract_answer,
    length_within,
    math_equivalent,
    normalize,
    numeric_match,
    regex_match,
)
from agrpo.rewards.registry import build_reward_funcs


def test_extract_modes():
    text = "Let me think.\nThe answer is Paris.\nThanks"
    assert extract_answer(text, "auto") == "Paris"
    assert extract_answer("no marker here\n  Lyon \n", "auto") == "Lyon"
    assert extract_answer(text, "last_line") == "Thanks"
    assert extract_answer(" whole ", "full") == "whole"
    assert extract_answer(r"x \boxed{42} y", "boxed") == "42" and extract_answer("none", "boxed") is None
    with pytest.raises(ValueError, match="extract='nope'"):
        extract_answer(text, "nope")
    assert normalize("  **Paris.** ") == "paris" and normalize("Paris", case_sensitive=True) == "Paris"


def test_exact_match_reads_the_named_column_per_completion():
    completions = ["The answer is Paris.", "The answer is Lyon", r"\boxed{paris}", ""]
    assert exact_match(completions, city=["Paris"] * 4, column="city") == [1.0, 0.0, 1.0, 0.0]
    assert exact_match(["answer: B"], answer=[["A", "b"]]) == [1.0]  # a list of accepted golds
    assert exact_match(["x"], answer=[None]) == [None]  # no gold: unscorable, not wrong
    assert exact_match(["The answer is PARIS"], answer=["paris"], case_sensitive=True) == [0.0]
    assert exact_match([[{"role": "assistant", "content": "answer: 7<|im_end|>"}]], answer=["7"]) == [1.0]
    with pytest.raises(KeyError, match=r"reads column 'answer', but the dataset rows hold \['gold'\]"):
        exact_match(["x"], gold=["x"])


def test_regex_match_one_pattern_or_one_per_row():
    assert regex_match(["<think>a</think> 4", "4"], regex=r"^<think>.+</think>") == [1.0, 0.0]
    assert regex_match(["abc", "abc"], column="rx", rx=[r"b", r"^b"]) == [1.0, 0.0]
    assert regex_match(["ABC"], regex="abc", fullmatch=True, ignore_case=True) == [1.0]
    assert regex_match(["abcd"], regex="abc", fullmatch=True) == [0.0]
    assert regex_match(["x"], column="rx", rx=[None]) == [None]
    with pytest.raises(ValueError, match="exactly one"):
        regex_match(["x"], regex="x", column="rx", rx=["x"])


def test_numeric_match_with_tolerance_and_number_formats():
    completions = ["so #### 1,080", "I get 3.14159 in the end", "about 3.2", "no number", r"\boxed{\$25}"]
    assert numeric_match(completions, answer=[1080, 3.1416, 3.1416, 3, "$25.00"], abs_tol=1e-3) == [
        1.0,
        1.0,
        0.0,
        0.0,
        1.0,
    ]
    assert numeric_match(["100"], answer=["105"], rel_tol=0.1) == [1.0]
    assert numeric_match(["100"], answer=["x+y"]) == [None]  # a gold that is no number cannot be scored


def test_math_equivalent_reuses_math_verify():
    assert math_equivalent([r"\boxed{0.5}", r"\boxed{\frac{2}{4}}", r"\boxed{1/3}"], answer=[r"\frac{1}{2}"] * 3) == [
        1.0,
        1.0,
        0.0,
    ]
    assert math_equivalent(["#### 72"], sol=["72"], column="sol") == [1.0]


def test_length_within_tokens_chars_words():
    assert length_within(["a", "b", "c"], completion_ids=[[1], [1, 2, 3], [1] * 9], max_len=3, min_len=2) == [
        0.0,
        1.0,
        0.0,
    ]
    assert length_within(["one two three"], unit="words", max_len=2) == [0.0]
    assert length_within(["abcd"], unit="chars", min_len=4) == [1.0]
    with pytest.raises(ValueError, match="completion_ids"):
        length_within(["a"], max_len=3)


@pytest.mark.parametrize("group", ["exact_match", "numeric_match", "math_equivalent", "regex_match"])
def test_shipped_reward_groups_build_and_pickle(group):
    cfg = compose_run_config(["+recipe=smoke", f"reward={group}"])
    rewards = build_reward_funcs(cfg.reward.funcs)
    clone = pickle.loads(pickle.dumps(rewards))
    row = {"answer": ["42"], "pattern": ["4"]}
    assert [r(completions=[r"\boxed{42}"], completion_ids=[[1, 2]], **row) for r in clone][0] == [1.0]


def test_composed_terms_with_weights():
    funcs = [
        {"_target_": "agrpo.rewards.generic.exact_match", "weight": 1.0},
        {"_target_": "agrpo.rewards.generic.length_within", "max_len": 2, "weight": 0.25},
    ]
    rewards = build_reward_funcs(funcs)
    scores = [r(completions=["#### 5", "#### 6"], completion_ids=[[1], [1, 2, 3]], answer=["5", "5"]) for r in rewards]
    assert scores == [[1.0, 0.0], [0.25, 0.0]]


def test_a_misspelt_option_is_refused_not_swallowed_by_the_columns():
    with pytest.raises(ConfigError, match=r"takes no option \['colum'\]"):
        build_reward_funcs([{"_target_": "agrpo.rewards.generic.exact_match", "colum": "gold"}])


USER_REWARD = """
def has_keyword(completions, keyword, **columns):
    return [float(k in c) for c, k in zip(completions, keyword)]
"""


def test_user_reward_from_a_file_path_is_picklable(tmp_path):
    (tmp_path / "my_rewards.py").write_text(USER_REWARD)
    rewards = build_reward_funcs([{"_target_": f"{tmp_path}/my_rewards.py:has_keyword", "weight": 2.0}])
    assert rewards[0].__name__ == "has_keyword"
    clone = pickle.loads(pickle.dumps(rewards[0]))  # TRL sends it to a spawned child
    assert clone(completions=["a cat", "a dog"], keyword=["cat", "cat"]) == [2.0, 0.0]
    with pytest.raises(ConfigError, match="no function 'nope'"):
        build_reward_funcs([{"_target_": f"{tmp_path}/my_rewards.py:nope"}])
    with pytest.raises(ConfigError, match="no file"):
        build_reward_funcs([{"_target_": f"{tmp_path}/missing.py:f"}])


def test_user_reward_from_a_module_in_the_working_directory(tmp_path, monkeypatch):
    import sys

    (tmp_path / "task_rewards_wd.py").write_text(USER_REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    rewards = build_reward_funcs([{"_target_": "task_rewards_wd.has_keyword"}])
    assert rewards[0](completions=["cat"], keyword=["cat"]) == [1.0]
    assert pickle.loads(pickle.dumps(rewards[0]))(completions=["dog"], keyword=["cat"]) == [0.0]
