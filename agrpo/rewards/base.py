"""Shared pieces of every reward: reading a completion's text, and weighting a reward function.

TRL's async rollout worker calls each reward as ``fn(completions=..., prompts=..., completion_ids=..., **columns)``
where ``columns`` are the dataset's other columns repeated per completion, and sums the results with weight 1.
Rewards therefore carry their own weight (:class:`WeightedReward`), and must be picklable: module-level functions or
instances of module-level classes, never lambdas.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from agrpo.rewards.contract import call_reward

# Chat special tokens as they appear in decoded text: <|im_start|>, <|endoftext|>, <|eot_id|>, ...
SPECIAL_TOKEN_MARKER = re.compile(r"<\|[^<>|\s]{1,40}\|>")


TURN_SEPARATOR = "\n\n"  # between the assistant turns of an agent's episode


def completion_text(completion: Any) -> str:
    """The generated text of one completion, whether TRL passed a string or a list of chat messages (an agent's
    episode: its assistant turns that wrote text, joined by TURN_SEPARATOR)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, list):
        # Turns apart: an answer "...3" then "42" in the next turn must not read as 342.
        turns = (completion_text(message) for message in completion if _is_assistant(message))
        return TURN_SEPARATOR.join(text for text in turns if text)
    raise TypeError(f"Cannot read a completion of type {type(completion).__name__}")


def visible_text(completion: Any) -> str:
    """The completion as a user of the served model reads it: special-token markers removed.

    The rollout loop (TRL's `parse_response`, as in TRL's own worker) keeps special tokens other than EOS in the
    completion text, while vLLM skips them in what it
    serves. A reward that scores characters would otherwise pay the policy for emitting `<|im_start|>` (mostly
    lowercase letters), which raises the training reward without improving a single served answer.
    """
    return SPECIAL_TOKEN_MARKER.sub("", completion_text(completion))


def _is_assistant(message: Any) -> bool:
    return isinstance(message, str) or message.get("role", "assistant") == "assistant"


class WeightedReward:
    """A reward function scaled by a weight, picklable, named after the function (TRL logs it under that name)."""

    def __init__(self, func: Callable[..., list[float | None]], weight: float = 1.0, name: str | None = None):
        self.func = func
        self.weight = float(weight)
        self.__name__ = name or getattr(func, "__name__", type(func).__name__)

    def __call__(self, **kwargs: Any) -> list[float | None]:
        """The weighted scores; a failing or misshapen reward raises agrpo.rewards.contract.RewardError."""
        scores = call_reward(self.func, self.__name__, kwargs)
        return [None if score is None else self.weight * score for score in scores]

    def __repr__(self) -> str:
        return f"WeightedReward({self.__name__}, weight={self.weight})"
