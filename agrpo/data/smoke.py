"""The smoke task: prompts that ask for lowercase letters. A tiny random model starts near the byte-level base rate
(about 13% of characters) and GRPO raises it within a few dozen steps on a CPU, which makes learning visible fast.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean", "pixel", "quartz", "zebra", "velvet")


def smoke_prompts(count: int, seed: int) -> list[str]:
    """Distinct instruction strings (a word and a number vary), so every GRPO group has its own prompt."""
    rng = random.Random(seed)
    return [f"Reply in lowercase letters only. Word {i}: {rng.choice(WORDS)}" for i in range(count)]


def load_smoke_dataset(data_cfg: Any, seed: int = 0):
    from datasets import Dataset

    count = data_cfg.max_prompts  # conf/data/smoke.yaml sets it: synthetic prompts have no natural count
    if not count:
        from agrpo.errors import ConfigError

        raise ConfigError("data=smoke needs data.max_prompts (how many synthetic prompts to make), e.g. 256")
    messages = []
    for text in smoke_prompts(count, seed):
        turn = [{"role": "user", "content": text}]
        if data_cfg.system_prompt:
            turn.insert(0, {"role": "system", "content": data_cfg.system_prompt})
        messages.append(turn)
    return Dataset.from_dict({"prompt": messages})
