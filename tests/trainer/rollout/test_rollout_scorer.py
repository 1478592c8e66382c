"""Scoring a finished group (agrpo/trainer/rollout/scorer.py), without vLLM: TRL's reward calling convention, the
sum and the group-normalised advantage written out, each sample's version the oldest its episode asked for, an
environment's own reward as a column; rewards that return None or NaN: a NaN ends the run naming the term, completions
every reward left out are counted (`rollout/unscored_total`), the first wholly unscored group is one warning, and
UNSCORED_GROUPS_LIMIT in a row end the run."""

from __future__ import annotations

import asyncio
import logging
import queue
from types import SimpleNamespace

import numpy as np
import pytest
from trl.experimental.async_grpo.async_rollout_worker import TrainingSequence

from agrpo.rewards.base import WeightedReward
from agrpo.rewards.contract import RewardError
from agrpo.rewards.unscored import UNSCORED_GROUPS_LIMIT, UNSCORED_METRIC
from agrpo.trainer.rollout.child import ProgressHeartbeat
from agrpo.trainer.rollout.episode import EpisodeEnd, EpisodeResult
from agrpo.trainer.rollout.figures import Figures
from agrpo.trainer.rollout.scorer import Group, GroupScorer, advantages, summed


def always_none(completions, **columns):
    return [None] * len(completions)


def half_none(completions, **columns):
    return [None if i % 2 else float(i) for i in range(len(completions))]


def nan_reward(completions, **columns):
    return [float("nan")] + [0.0] * (len(completions) - 1)


def by_answer(completions, answer, **columns):
    """Reads a dataset column the way a TRL reward does: one value per completion."""
    return [float(len(c[0]["content"]) == a) for c, a in zip(completions, answer)]


async def async_length(completions, completion_ids, **columns):
    return [0.1 * len(ids) for ids in completion_ids]


class Scored:
    """An environment class that scores itself (a reward column named after it)."""


def scorer(*funcs, classes=(), tools=False) -> tuple[GroupScorer, queue.Queue]:
    sink = queue.Queue()
    rewards = [f if asyncio.iscoroutinefunction(f) else WeightedReward(f, 1.0) for f in funcs]  # TRL awaits async ones
    heartbeat = ProgressHeartbeat(SimpleNamespace(value=0.0))
    return GroupScorer(rewards, list(classes), heartbeat, Figures(sink), tools), sink


def result(text: str = "2", versions=(0,), rows: int = 1, calls: int = 0) -> EpisodeResult:
    ids = list(range(2, 2 + len(text)))
    sequences = [TrainingSequence([1, *ids], [0] + [1] * len(ids), [0.0] + [-0.5] * len(ids), "r") for _ in range(rows)]
    return EpisodeResult(
        [{"role": "assistant", "content": text}], ids, sequences, calls, 0, list(versions), EpisodeEnd.ANSWERED
    )


def group(group_id: int, size: int = 4, results=None) -> Group:
    g = Group(
        group_id, {"prompt": [{"role": "user", "content": f"What is {group_id} + 1?"}], "answer": group_id + 1}, size
    )
    for r in results or [result() for _ in range(size)]:
        g.prompts.append(g.row["prompt"])
        g.results.append(r)
        g.env_rewards.append(None)
        g.finished += 1
    return g


def pushed(sink: queue.Queue) -> list[dict]:
    found = []
    while not sink.empty():
        found.append(sink.get_nowait())
    return found


def test_rewards_sum_into_group_normalised_advantages_with_each_rollouts_own_version():
    score, _ = scorer(by_answer, async_length)
    texts = ["1", "22", "333", "4444"]
    g = group(1, results=[result(t, versions=v) for t, v in zip(texts, [(3,), (3, 4), (4,), (4, 5)])])
    samples = asyncio.run(score.score(g))
    rewards = np.array([0.1, 1.2, 0.3, 0.4])  # by_answer: length == 2; async_length: 0.1 per token
    expected = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    assert [s.metrics["reward"] for s in samples] == pytest.approx(rewards)
    assert [s.advantage for s in samples] == pytest.approx(expected)
    assert [s.model_version for s in samples] == [3, 3, 4, 4]  # the oldest version each episode asked for
    assert samples[1].metrics["rewards/by_answer"] == 1.0 and samples[1].metrics[
        "rewards/async_length"
    ] == pytest.approx(0.2)
    assert samples[0].input_ids.dtype == np.int64 and samples[0].old_log_probs.dtype == np.float32
    assert "tools/call_frequency" not in samples[0].metrics  # TRL's: left out of a group without a call


def test_every_row_of_a_conversation_carries_its_one_advantage():
    score, _ = scorer(by_answer)
    samples = asyncio.run(score.score(group(1, size=2, results=[result("22", rows=2), result("1")])))
    assert len(samples) == 3 and samples[0].advantage == samples[1].advantage > 0 > samples[2].advantage


def test_an_environment_that_scores_itself_is_a_column_of_its_own():
    score, _ = scorer(classes=[Scored])
    g = group(0, size=2)
    g.env_rewards = [(Scored, 2.0), None]  # the second episode's environment scores nothing itself
    samples = asyncio.run(score.score(g))
    assert samples[0].metrics["rewards/Scored"] == 2.0 and np.isnan(samples[1].metrics["reward"])
    assert [s.advantage for s in samples] == [0.0, 0.0]


def test_an_agent_run_reports_tool_figures_at_zero_too():
    score, _ = scorer(by_answer, tools=True)
    samples = asyncio.run(score.score(group(0, size=2, results=[result(calls=2), result()])))
    assert [s.metrics["tools/call_frequency"] for s in samples] == [2.0, 0.0]
    assert [s.metrics["tools/failure_frequency"] for s in samples] == [0.0, 0.0]


def test_the_pure_sum_and_advantages():
    total = summed([[1.0, None, None], [0.5, 2.0, None]])
    assert total[:2].tolist() == [1.5, 2.0] and np.isnan(total[2])
    adv, mean, std = advantages(np.array([1.0, 3.0, np.nan]))
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0]) and (mean, std) == (2.0, 1.0)


def test_a_nan_score_ends_the_run_naming_the_term_the_value_and_the_row():
    score, _ = scorer(nan_reward)
    with pytest.raises(RewardError, match=r"reward term 'nan_reward' returned nan for 1 of 4 completions .*What is 3"):
        asyncio.run(score.score(group(3)))


def test_left_out_completions_are_counted_and_train_with_advantage_zero():
    score, sink = scorer(half_none)
    samples = asyncio.run(score.score(group(0)))
    assert [s.advantage == 0.0 for s in samples] == [False, True, False, True]
    assert [p for p in pushed(sink) if UNSCORED_METRIC in p] == [{UNSCORED_METRIC: 2.0}]


def test_groups_that_score_nothing_warn_once_then_end_the_run(caplog):
    score, sink = scorer(always_none)
    with caplog.at_level(logging.WARNING, logger="agrpo.trainer.rollout.scorer"):
        for group_id in range(UNSCORED_GROUPS_LIMIT - 1):
            asyncio.run(score.score(group(group_id)))
        with pytest.raises(RewardError) as raised:
            asyncio.run(score.score(group(99)))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("every reward term returned None for all 4 completions")
    text = str(raised.value)
    assert text.startswith(
        f"every reward term ('always_none') returned None for all completions of {UNSCORED_GROUPS_LIMIT}"
    )
    assert "the last one the row [prompt 'What is 99 + 1?', answer=100]" in text
    assert sum(p.get(UNSCORED_METRIC, 0) for p in pushed(sink)) == 4 * (UNSCORED_GROUPS_LIMIT - 1)


def test_the_heartbeat_is_held_at_the_start_of_a_reward_call_while_it_runs():
    seen = []

    def watching(completions, **columns):
        seen.append(score.heartbeat.scoring_since)
        return [1.0] * len(completions)

    score, _ = scorer(watching)
    asyncio.run(score.score(group(0)))
    assert seen[0] is not None and score.heartbeat.scoring_since is None
