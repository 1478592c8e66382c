"""Reward of the smoke task (agrpo/data/smoke.py)."""

from __future__ import annotations

from typing import Any

from agrpo.rewards.base import completion_text


def lowercase_fraction(completions: list[Any], **_columns: Any) -> list[float]:
    """Share of the completion's characters that are ASCII lowercase letters (0 for an empty completion)."""
    scores = []
    for completion in completions:
        text = completion_text(completion)
        scores.append(sum("a" <= ch <= "z" for ch in text) / len(text) if text else 0.0)
    return scores
