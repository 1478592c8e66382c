"""Completions no reward scored (agrpo/rewards/unscored.py): counted, one warning, and the end of a run in which
group after group has nothing to train on. Pure; the rollout loop's scorer feeds it
(tests/trainer/rollout/test_rollout_scorer.py)."""

from __future__ import annotations

import pytest

from agrpo.rewards.contract import RewardError
from agrpo.rewards.unscored import UNSCORED_GROUPS_LIMIT, UnscoredTally

NAN = float("nan")


def test_some_left_out_completions_are_counted_and_never_end_the_run():
    tally = UnscoredTally(("accuracy",))
    for _ in range(3 * UNSCORED_GROUPS_LIMIT):
        assert tally.add([1.0, NAN, None, 0.0], "row") is None  # scored completions in every group
    assert (tally.unscored, tally.completions, tally.in_a_row) == (
        6 * UNSCORED_GROUPS_LIMIT,
        12 * UNSCORED_GROUPS_LIMIT,
        0,
    )


def test_the_first_group_left_out_entirely_is_one_warning():
    tally = UnscoredTally(("accuracy",))
    warning = tally.add([NAN, NAN], "prompt 'What is 3 + 4?'")
    assert warning.startswith("every reward term returned None for all 2 completions of the row [prompt 'What is")
    assert f"The run ends if {UNSCORED_GROUPS_LIMIT} groups in a row are left out" in warning
    assert tally.add([NAN, NAN], "row") is None  # once
    assert tally.add([0.5, NAN], "row") is None and tally.in_a_row == 0  # a scored completion breaks the run of groups


def test_groups_in_a_row_left_out_end_the_run_naming_the_terms_and_the_count():
    tally = UnscoredTally(("accuracy", "format"), limit=3)
    tally.add([1.0, 0.0], "row")
    tally.add([NAN, NAN], "row")
    tally.add([NAN, NAN], "row")
    with pytest.raises(RewardError) as raised:
        tally.add([None, NAN], "prompt 'What is 2 + 2?', answer=4")
    text = str(raised.value)
    assert text.startswith("every reward term ('accuracy', 'format') returned None for all completions of 3 groups")
    assert "(6 of the 8 completions scored so far)" in text
    assert "the last one the row [prompt 'What is 2 + 2?', answer=4]" in text
    assert "nothing to train on" in text
