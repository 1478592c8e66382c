"""A finished group -> scored `RolloutSample`s (TRL's public sample type, what TRL's trainer drains).

The calling convention is TRL's, so a reward written for TRL works unchanged: each reward function gets
`completions`, `prompts`, `completion_ids` and every other column of the row (one value per completion) as keywords;
async ones are awaited, sync ones run in a thread. An environment class that scores itself is one more column. The
sum over columns is the reward (a function may answer None for a completion it cannot judge; a completion no column
scored is unscored: NaN, advantage 0, counted by agrpo/rewards/unscored.py, which ends the run when group after
group has nothing to train on). The advantage is group-normalised over the scored completions:
`(r - mean) / (std + 1e-8)`, one per conversation, on every training row it produced.

What agrpo adds: a sample's version is the oldest adapter version its episode's requests asked for (TRL labels a
group with the version current when it began, so a group spanning a sync was mislabelled and dropped as stale for
nothing); the heartbeat is held at the start of a reward call while it runs (a hung reward is a hang, not a live
child); the oldest adapter version an open rollout may still ask for goes to the trainer (adapter_retention.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
from trl.trainer.utils import get_callable_name, is_async_callable

from agrpo.rewards.contract import describe_row
from agrpo.rewards.unscored import UNSCORED_METRIC, UnscoredTally
from agrpo.trainer.rollout.episode import EpisodeResult
from agrpo.trainer.rollout.figures import Figures

log = logging.getLogger(__name__)
NOT_REWARD_COLUMNS = frozenset({"prompt", "completion", "completion_ids"})


@dataclass
class Group:
    """The `size` episodes of one dataset row, gathered as they finish (in finishing order)."""

    group_id: int
    row: dict[str, Any]
    size: int
    prompts: list[list[dict]] = field(default_factory=list)
    results: list[EpisodeResult] = field(default_factory=list)
    env_rewards: list[tuple[type, float] | None] = field(default_factory=list)
    retired: bool = False  # an episode's adapter version was retired: the group is dropped unscored
    finished: int = 0
    queued_at: float = 0.0

    @property
    def complete(self) -> bool:
        return self.finished == self.size

    def reward_columns(self) -> dict[str, list[Any]]:
        return {key: [value] * len(self.results) for key, value in self.row.items() if key not in NOT_REWARD_COLUMNS}


def advantages(rewards: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(advantage per completion, mean, std) over the scored (non-NaN) rewards; unscored ones get 0 (pure)."""
    scored = ~np.isnan(rewards)
    out = np.zeros_like(rewards)
    if not scored.any():
        return out, float("nan"), float("nan")
    values = rewards[scored]
    out[scored] = (values - values.mean()) / (values.std() + 1e-8)
    return out, float(values.mean()), float(values.std())


def summed(columns: list[list[float | None]]) -> np.ndarray:
    """The reward per completion: the sum of its columns, NaN where no column scored it (pure)."""
    table = np.array([[np.nan if r is None else r for r in column] for column in columns], dtype=float)
    total = np.nansum(table, axis=0)
    total[np.all(np.isnan(table), axis=0)] = np.nan
    return total


class GroupScorer:
    def __init__(
        self, reward_funcs: list[Any], reward_classes: list[type], heartbeat: Any, figures: Figures, tool_figures: bool
    ):
        self.reward_funcs = reward_funcs
        self.reward_classes = reward_classes
        self.names = [get_callable_name(f) for f in reward_funcs] + [cls.__name__ for cls in reward_classes]
        self.heartbeat = heartbeat  # ProgressHeartbeat (child.py)
        self.figures = figures
        self.tool_figures = tool_figures  # an agent run: tool figures per sample, at 0 too
        self.unscored = UnscoredTally(self.names)

    async def score(self, group: Group) -> list[RolloutSample]:
        columns = await self._columns(group)
        rewards = summed(columns)
        advantage, _, reward_std = advantages(rewards)
        self._count_unscored(group, rewards)
        samples = []
        for i, result in enumerate(group.results):
            metrics = {
                "reward": float(rewards[i]),
                "reward_std": reward_std,
                **{f"rewards/{name}": _float(column[i]) for name, column in zip(self.names, columns)},
                **self._tool_figures(group, result),
            }
            version = min(result.versions)
            for row in result.sequences:
                samples.append(
                    RolloutSample(
                        prompt=group.prompts[i],
                        completion=result.completion,
                        input_ids=np.asarray(row.input_ids, dtype=np.int64),
                        completion_mask=np.asarray(row.completion_mask, dtype=np.int64),
                        old_log_probs=np.asarray(row.old_log_probs, dtype=np.float32),
                        advantage=float(advantage[i]),
                        model_version=version,
                        group_id=group.group_id,
                        metrics=dict(metrics),
                    )
                )
        return samples

    async def _columns(self, group: Group) -> list[list[float | None]]:
        """Every reward function's column, then one per self-scoring environment class; the heartbeat held at the
        start of the call while it runs."""
        kwargs = dict(
            completions=[r.completion for r in group.results],
            prompts=group.prompts,
            completion_ids=[r.completion_ids for r in group.results],
            **group.reward_columns(),
        )
        self.heartbeat.scoring_since = time.time()
        try:
            columns = list(
                await asyncio.gather(
                    *[
                        f(**kwargs) if is_async_callable(f) else asyncio.to_thread(f, **kwargs)
                        for f in self.reward_funcs
                    ]
                )
            )
        finally:
            self.heartbeat.scoring_since = None
            self.heartbeat.value = time.time()
        for cls in self.reward_classes:
            columns.append([r[1] if r is not None and r[0] is cls else None for r in group.env_rewards])
        return columns

    def _tool_figures(self, group: Group, result: EpisodeResult) -> dict[str, float]:
        if not self.tool_figures and not any(r.tool_calls for r in group.results):
            return {}  # TRL's: left out of a group without a call
        calls = result.tool_calls
        return {
            "tools/call_frequency": float(calls),
            "tools/failure_frequency": result.tool_failures / calls if calls else 0.0,
        }

    def _count_unscored(self, group: Group, rewards: np.ndarray) -> None:
        """Completions no reward scored: counted, warned about once, the run ended when nothing can train."""
        trained = [float(r) for r, result in zip(rewards, group.results) if result.sequences]
        if not trained:
            return
        row = describe_row({"prompts": group.prompts, **group.reward_columns()})
        warning = self.unscored.add(trained, row)  # raises RewardError: the loop reports it and the run ends
        if warning:
            log.warning("%s", warning)
        left_out = sum(1 for r in trained if r != r)
        if left_out:
            self.figures.push({UNSCORED_METRIC: float(left_out)})


def _float(value: Any) -> float:
    return float("nan") if value is None else float(value)
