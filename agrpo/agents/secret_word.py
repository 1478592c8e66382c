"""The agent_smoke task: a secret word the policy can only learn by calling a tool, for the right player.

Each row names a player (the `player` column and the prompt); each episode draws that player's secret at `reset`.
The prompt never contains the word, and `get_secret(player)` (the environment's one tool) reveals it only when asked
for the episode's own player: any other name gets "no such player", so the call's argument matters, not only the
choice to call. Two rewards, neither earnable without the right call: the environment's own (`get_reward`: 1 when the
secret was revealed) and `answer_has_secret` (a reward term: 1 when the final answer contains the word a tool
revealed). `get_secret` also exists as a plain function, for the tools-only variant (conf/agent/secret_word_tool.yaml):
same name, signature and docstring, so the model sees the same tool either way.
"""

from __future__ import annotations

import random
from typing import Any

# Five letters with distinct first letters: after a tool answer, copying its first letter decides the word.
WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "lemon", "ocean")
PLAYERS = ("Ada", "Bruno", "Chen", "Dara", "Emil", "Femi", "Gita", "Hugo")
ASKS = (
    "What is the secret word of player {player}?",
    "Tell me the secret word of {player}.",
    "Which word is the secret of player {player}?",
    "Find the secret word of {player} and say it.",
)
UNKNOWN = "no such player"
_random = random.SystemRandom()  # a secret no seed reproduces: the prompt must not predict it


def secret_word_rows(count: int, seed: int) -> list[tuple[str, str]]:
    """(player, prompt) pairs; the prompts are distinct (a table number, a player and a phrasing vary), so every GRPO
    group has its own prompt."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        player = rng.choice(PLAYERS)
        rows.append((player, rng.choice(ASKS).format(player=player)))
    return rows


def load_secret_word_dataset(data_cfg: Any, seed: int = 0):
    """`data.loader` of agent_smoke: synthetic rows, `data.max_prompts` of them (the test split uses other seeds)."""
    from datasets import Dataset

    count = data_cfg.max_prompts or 256
    offset = 0 if getattr(data_cfg, "split", "train") == "train" else 1_000_003  # eval: prompts never trained on
    rows = secret_word_rows(count, seed + offset)
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": text}] for _, text in rows], "player": [p for p, _ in rows]}
    )


def get_secret(player: str) -> str:
    """Reveal the secret word of a player.

    Args:
        player: The player's name, as the question gives it.

    Returns:
        The player's secret word.
    """
    return _random.choice(WORDS) if player in PLAYERS else UNKNOWN


class SecretWordEnv:
    """One episode of the secret-word game: `reset` draws the row's player's word, `get_secret` reveals it."""

    def __init__(self, words: list[str] | None = None):
        self.words = tuple(words or WORDS)
        self.player = ""
        self.secret = ""
        self.revealed = False

    def reset(self, player: str = "", **row: Any) -> None:
        self.player = player
        self.secret = _random.choice(self.words)
        self.revealed = False

    def get_secret(self, player: str) -> str:
        """Reveal the secret word of a player.

        Args:
            player: The player's name, as the question gives it.

        Returns:
            The player's secret word.
        """
        if str(player).strip().lower() != self.player.lower():
            return UNKNOWN
        self.revealed = True
        return self.secret

    def get_reward(self) -> float:
        return 1.0 if self.revealed else 0.0


def _messages(completion: Any) -> list[dict]:
    return completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]


def answer_has_secret(completions: list[Any], **columns: Any) -> list[float]:
    """1.0 when an episode's final answer contains the secret word its last tool call revealed, else 0.0 (no call, or
    a call for another player: nothing to contain). TRL hands an agent's completion over as its messages: assistant
    turns and tool answers."""
    scores = []
    for completion in completions:
        messages = _messages(completion)
        revealed = [str(m.get("content", "")).strip() for m in messages if m.get("role") == "tool"]
        answer = str(messages[-1].get("content") or "") if messages[-1].get("role") == "assistant" else ""
        word = revealed[-1].lower() if revealed else ""
        scores.append(1.0 if word in WORDS and word in answer.lower() else 0.0)
    return scores
