"""Reward functions. Each follows TRL's reward signature and is picklable (TRL scores in a spawned child).

A reward receives each completion as a list of chat messages, in training and in `agrpo eval` (see
agrpo/rewards/contract.py); `completion_text(completion)` reads its text (a plain string works too).
"""

from agrpo.rewards.base import completion_text, visible_text

__all__ = ["completion_text", "visible_text"]
