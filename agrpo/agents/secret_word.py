"""The agent_smoke task: a secret word the policy can only learn by calling a tool.

Each episode draws a secret at `reset`; the prompt never contains it, and `get_secret` (the environment's one tool)
reveals it. Two rewards, neither earnable without the tool: the environment's own (`get_reward`: 1 when get_secret
was called) and `answer_has_secret` (a reward term: 1 when the final answer contains the word a tool returned).
`get_secret` also exists as a plain function, for the tools-only variant (conf/agent/secret_word_tool.yaml): same
name and docstring, so the model sees the same tool either way.
"""

from __future__ import annotations

import random
from typing import Any

# Five letters with distinct first letters: after a tool answer, copying its first letter decides the word.
WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "lemon", "ocean")
ASKS = (
    "What is the secret word?",
    "Tell me the secret word.",
    "Which word is the secret?",
    "Find the secret word and say it.",
)
_random = random.SystemRandom()  # a secret no seed reproduces: the prompt must not predict it


def secret_word_prompts(count: int, seed: int) -> list[str]:
    """Distinct prompts (a player number and a phrasing vary), so every GRPO group has its own prompt."""
    rng = random.Random(seed)
    return [f"Player {rng.randrange(10_000)}: {rng.choice(ASKS)}" for _ in range(count)]


def load_secret_word_dataset(data_cfg: Any, seed: int = 0):
    """`data.loader` of agent_smoke: synthetic prompts, `data.max_prompts` of them (the test split uses other seeds)."""
    from datasets import Dataset

    count = data_cfg.max_prompts or 256
    offset = 0 if getattr(data_cfg, "split", "train") == "train" else 1_000_003  # eval: prompts never trained on
    prompts = [[{"role": "user", "content": text}] for text in secret_word_prompts(count, seed + offset)]
    return Dataset.from_dict({"prompt": prompts})


def get_secret() -> str:
    """Reveal the secret word of this episode.

    Returns:
        The secret word.
    """
    return _random.choice(WORDS)


class SecretWordEnv:
    """One episode of the secret-word game: `reset` draws the word, `get_secret` reveals it."""

    def __init__(self, words: list[str] | None = None):
        self.words = tuple(words or WORDS)
        self.secret = ""
        self.revealed = False

    def reset(self, **row: Any) -> None:
        self.secret = _random.choice(self.words)
        self.revealed = False

    def get_secret(self) -> str:
        """Reveal the secret word of this episode.

        Returns:
            The secret word.
        """
        self.revealed = True
        return self.secret

    def get_reward(self) -> float:
        return 1.0 if self.revealed else 0.0


def _messages(completion: Any) -> list[dict]:
    return completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]


def answer_has_secret(completions: list[Any], **columns: Any) -> list[float]:
    """1.0 when an episode's final answer contains the word its last tool call returned, else 0.0 (no tool call:
    nothing to contain). TRL hands an agent's completion over as its messages: assistant turns and tool answers."""
    scores = []
    for completion in completions:
        messages = _messages(completion)
        revealed = [str(m.get("content", "")).strip() for m in messages if m.get("role") == "tool"]
        answer = str(messages[-1].get("content") or "") if messages[-1].get("role") == "assistant" else ""
        scores.append(1.0 if revealed and revealed[-1] and revealed[-1].lower() in answer.lower() else 0.0)
    return scores
