"""The reward contract (agrpo/rewards/contract.py): how a reward is called, and the one paragraph a failing or
misshapen reward produces, naming the term, the error, the line of the user's file and the row."""

from __future__ import annotations

import pytest

from agrpo.rewards.base import WeightedReward
from agrpo.rewards.contract import RewardError, as_messages, call_reward, describe_row
from agrpo.rewards.registry import FileFunction

ROW = {
    "completions": [as_messages("Sure, 7."), as_messages("8")],
    "prompts": [[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 3 + 4?"}]] * 2,
    "completion_ids": [[1, 2], [3]],
    "answer": [7, 7],
    "source": ["synthetic", "synthetic"],
}

STRING_REWARD = """
def starts_politely(completions, answer, **columns):
    return [1.0 if c.strip().lower().startswith(("sure", "certainly")) else 0.0 for c in completions]
"""


def test_a_string_reward_fails_with_the_term_the_line_the_row_and_the_fix(tmp_path):
    (tmp_path / "my_rewards.py").write_text(STRING_REWARD)
    reward = WeightedReward(FileFunction(tmp_path / "my_rewards.py", "starts_politely"), 0.2, name="starts_politely")
    with pytest.raises(RewardError) as raised:
        reward(**ROW)
    text = str(raised.value)
    assert text.startswith("reward term 'starts_politely' raised AttributeError: 'list' object has no attribute")
    assert "(my_rewards.py, line 3)" in text
    assert "the row [prompt 'What is 3 + 4?', answer=7, source='synthetic']" in text
    assert "agrpo.rewards.completion_text(completion)" in text


def test_completion_text_makes_the_same_reward_work_on_messages_and_strings():
    from agrpo.rewards import completion_text

    def starts_politely(completions, **columns):
        return [1.0 if completion_text(c).strip().lower().startswith("sure") else 0.0 for c in completions]

    assert WeightedReward(starts_politely, 0.5)(**ROW) == [0.5, 0.0]
    assert starts_politely(["Sure.", "no"]) == [1.0, 0.0]


def test_an_episodes_turns_are_read_apart():
    """Issue 32: the assistant turns of an agent's episode were joined with nothing between them, so a numeric
    reward read "...is 3" then "42" as 342. A turn that only called a tool (no text) adds nothing."""
    from agrpo.rewards import completion_text
    from agrpo.rewards.generic import numeric_match

    episode = [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "convert", "arguments": {}}}]},
        {"role": "tool", "name": "convert", "content": "11.1"},
        {"role": "assistant", "content": "Let me see, the count is 3"},
        {"role": "assistant", "content": "42"},
    ]
    assert completion_text(episode) == "Let me see, the count is 3\n\n42"
    assert completion_text([{"role": "assistant", "content": "Sure."}]) == "Sure."
    assert numeric_match([episode], answer=[342]) == [0.0]


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ([1.0], "returned 1 scores for 2 completions"),
        ([1.0, "yes"], "returned 'yes' among its scores"),
        ([1.0, [0.5]], r"returned \[0.5\] among its scores"),
    ],
)
def test_misshapen_answers_are_refused_with_the_row(scores, message):
    with pytest.raises(RewardError, match=message) as raised:
        call_reward(lambda **_: scores, "shape", ROW)
    assert "prompt 'What is 3 + 4?'" in str(raised.value)


def test_numbers_of_every_kind_and_none_are_scores():
    import numpy as np

    assert call_reward(lambda **_: [True, None], "t", ROW) == [1.0, None]
    assert call_reward(lambda **_: np.array([0.25, 1]), "t", ROW) == [0.25, 1.0]
    assert call_reward(lambda **_: (x for x in [np.bool_(True), 2]), "t", ROW) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("scores", "shown", "how_many"),
    [
        ([float("nan"), 1.0], "nan", "1 of 2"),
        ([float("inf"), float("-inf")], "-inf, inf", "2 of 2"),
    ],
)
def test_nan_and_infinity_end_the_run_naming_the_term_the_value_and_how_many(scores, shown, how_many):
    import numpy as np

    for answer in (scores, np.array(scores)):  # a numpy reward's NaN is the same mistake
        with pytest.raises(RewardError) as raised:
            WeightedReward(lambda **_: answer, 1.0, name="ratio")(**ROW)
        text = str(raised.value)
        assert text.startswith(f"reward term 'ratio' returned {shown} for {how_many} completions")
        assert "the row [prompt 'What is 3 + 4?', answer=7" in text
        assert "return None to leave a completion out" in text


def test_an_error_in_agrpos_own_reward_points_at_it():
    from agrpo.rewards.generic import regex_match

    with pytest.raises(RewardError, match=r"raised ValueError: regex_match: set exactly one of .*\(generic.py, line"):
        WeightedReward(regex_match, name="format")(**ROW)


def test_describe_row_is_short_and_shows_the_last_user_turn():
    long = {"prompts": [[{"role": "user", "content": "x" * 500}]], "notes": ["y" * 500]}
    text = describe_row(long)
    assert len(text) <= 300 and text.startswith("prompt 'xxx") and "notes='yyy" in text
    assert describe_row({"prompts": ["plain"], "completions": [1]}) == "prompt 'plain'"


def test_agrpo_eval_calls_rewards_the_same_way_and_fails_the_same_way(tmp_path):
    """A reward that works in eval works in training: eval passes chat messages too, and fails with the paragraph."""
    from omegaconf import OmegaConf

    from agrpo.eval.runner import score_problem
    from agrpo.rewards.registry import build_reward_funcs

    (tmp_path / "my_rewards.py").write_text(STRING_REWARD)
    rewards = build_reward_funcs([{"_target_": f"{tmp_path}/my_rewards.py:starts_politely"}])
    cfg = OmegaConf.create({"eval": {"correct_term": 0, "correct_threshold": 1.0}})
    row = {"prompt": ROW["prompts"][0], "answer": 7}
    with pytest.raises(RewardError, match=r"reward term 'starts_politely' raised AttributeError.*What is 3 \+ 4"):
        score_problem(0, row, [{"text": "Sure", "token_ids": [1]}], rewards, ["starts_politely"], cfg)
