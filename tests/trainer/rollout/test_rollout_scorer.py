"""Rewards that return None or NaN, through TRL's real scoring (`_AsyncRolloutLoop._score_group`) inside agrpo's
guarded loop, without vLLM: a NaN ends the run naming the term; completions every reward left out are counted
(`rollout/unscored_total`), the first wholly unscored group is one warning, and UNSCORED_GROUPS_LIMIT in a row end
the run. The loop is built without TRL's constructor (dataset, tokenizer, queues): only scoring is exercised."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup, TrainingSequence

from agrpo.rewards.base import WeightedReward
from agrpo.rewards.contract import RewardError
from agrpo.rewards.unscored import UNSCORED_GROUPS_LIMIT, UNSCORED_METRIC
from agrpo.trainer.guarded_loop import GuardedRolloutLoop, ProgressHeartbeat


def always_none(completions, **columns):
    return [None] * len(completions)


def half_none(completions, **columns):
    return [None if i % 2 else float(i) for i in range(len(completions))]


def nan_reward(completions, **columns):
    return [float("nan")] + [0.0] * (len(completions) - 1)


def scoring_loop(*funcs) -> GuardedRolloutLoop:
    from accelerate.state import PartialState

    PartialState()  # TRL's loop logs through accelerate, which wants it
    loop = GuardedRolloutLoop.__new__(GuardedRolloutLoop)
    rewards = [WeightedReward(f, 1.0) for f in funcs]
    loop.__dict__.update(reward_funcs=rewards, reward_func_names=[r.__name__ for r in rewards])
    loop.__dict__.update(_env_reward_types=[], _retired_groups=set(), pushed=[])
    loop._model_version_value = SimpleNamespace(value=0)
    loop._progress = ProgressHeartbeat(SimpleNamespace(value=0.0))
    loop.push_figures = loop.pushed.append
    return loop


def group(group_id: int, size: int = 4) -> RolloutGroup:
    prompt = [{"role": "user", "content": f"What is {group_id} + 1?"}]
    rows = [[TrainingSequence([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5], f"r{group_id}-{i}")] for i in range(size)]
    return RolloutGroup(
        prompts=[prompt] * size,
        reward_kwargs={"answer": [group_id + 1] * size},
        completions=[[{"role": "assistant", "content": "2"}]] * size,
        completions_ids=[[2, 3]] * size,
        completions_sequences=rows,
        tool_call_counts=[0] * size,
        tool_failure_counts=[0] * size,
        model_version=0,
        group_id=group_id,
        env_rewards=[None] * size,
        rollout_rewards=[None] * size,
    )


def test_a_nan_score_ends_the_run_naming_the_term_the_value_and_the_row():
    loop = scoring_loop(nan_reward)
    with pytest.raises(RewardError, match=r"reward term 'nan_reward' returned nan for 1 of 4 completions .*What is 3"):
        asyncio.run(loop._score_group(group(3)))


def test_left_out_completions_are_counted_and_train_with_advantage_zero():
    loop = scoring_loop(half_none)
    samples = asyncio.run(loop._score_group(group(0)))
    assert [s.advantage == 0.0 for s in samples] == [False, True, False, True]
    assert [p for p in loop.pushed if UNSCORED_METRIC in p] == [{UNSCORED_METRIC: 2.0}]


def test_groups_that_score_nothing_warn_once_then_end_the_run(caplog):
    loop = scoring_loop(always_none)
    with caplog.at_level(logging.WARNING, logger="agrpo.trainer.guarded_loop"):
        for group_id in range(UNSCORED_GROUPS_LIMIT - 1):
            asyncio.run(loop._score_group(group(group_id)))
        with pytest.raises(RewardError) as raised:
            asyncio.run(loop._score_group(group(99)))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("every reward term returned None for all 4 completions")
    text = str(raised.value)
    assert text.startswith(
        f"every reward term ('always_none') returned None for all completions of {UNSCORED_GROUPS_LIMIT}"
    )
    assert "the last one the row [prompt 'What is 99 + 1?', answer=100]" in text
    assert sum(p.get(UNSCORED_METRIC, 0) for p in loop.pushed) == 4 * (UNSCORED_GROUPS_LIMIT - 1)
