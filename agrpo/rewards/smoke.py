"""Reward of the smoke task (agrpo/data/smoke.py)."""

from __future__ import annotations

from typing import Any

from agrpo.rewards.base import visible_text


def lowercase_fraction(completions: list[Any], **_columns: Any) -> list[float]:
    """Share of the completion's visible characters that are ASCII lowercase letters (0 for an empty completion).

    Special-token markers do not count (see `visible_text`): the policy is paid for letters a user sees.
    """
    scores = []
    for completion in completions:
        text = visible_text(completion)
        scores.append(sum("a" <= ch <= "z" for ch in text) / len(text) if text else 0.0)
    return scores
