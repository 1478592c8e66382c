"""`agrpo eval`'s own checks, in the one validation pass (`prepare(cfg, evaluating=True)`), and the one machine fact
its resolution needs: the rank of the adapter it serves.

They used to fail inside the evaluation, after the config was resolved: a recipe that trains from a local file with
no test file named, an eval.adapter folder that holds no adapter, an eval.correct_term past the reward terms.
"""

from __future__ import annotations

import json
from pathlib import Path
from omegaconf import DictConfig

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def eval_problems(cfg: DictConfig, check_environment: bool = True) -> list[str]:
    """Which test problems, which adapter, which term decides "correct"."""
    problems = eval_data_problems(cfg)
    if check_environment:
        problems += adapter_problems(cfg) + correct_term_problems(cfg)
    return problems


def eval_data_problems(cfg: DictConfig) -> list[str]:
    """A recipe that trains from a local file (data.path) must name the test file: evaluating the training file by
    accident would report training accuracy as test accuracy."""
    if cfg.eval.path or cfg.eval.name or not cfg.data.path:
        return []
    return [
        f"data.path={cfg.data.path!r} is the training file: set eval.path to a test file "
        "(e.g. eval.path=${data_dir}/gsm8k/test.jsonl) or eval.name to a dataset"
    ]


def adapter_problems(cfg: DictConfig) -> list[str]:
    adapter = cfg.eval.adapter
    if not adapter or (Path(adapter) / ADAPTER_WEIGHTS).is_file() and (Path(adapter) / ADAPTER_CONFIG).is_file():
        return []
    return [
        f"eval.adapter={adapter!r} holds no {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG} (expected a peft adapter folder, "
        "e.g. <run dir>/final_adapter)"
    ]


def correct_term_problems(cfg: DictConfig) -> list[str]:
    """eval.correct_term indexes the reward terms: the run's, then those its environments add (agents/build.py)."""
    from agrpo.agents.build import Agent
    from agrpo.errors import ConfigError

    try:
        agent = Agent.from_config(cfg.agent)
    except ConfigError:
        return []  # the agent's own checks name what is wrong (agrpo/agents/checks.py)
    count = len(cfg.reward.funcs or []) + len(agent.reward_names() if agent else [])
    if 0 <= cfg.eval.correct_term < count:
        return []
    return [f"eval.correct_term={cfg.eval.correct_term} is not a reward term index (0..{count - 1})"]


def served_adapter_rank(cfg: DictConfig) -> int | None:
    """The LoRA rank of eval.adapter when `agrpo eval` starts the replicas that serve it (inference.max_lora_rank must
    hold it, whatever lora.r the recipe trains); None without an adapter or with inference.urls (servers of one's
    own, started with their own rank)."""
    if not cfg.eval.adapter or cfg.inference.urls:
        return None
    return int(json.loads((Path(cfg.eval.adapter) / ADAPTER_CONFIG).read_text())["r"])
