"""Checks of what this machine's libraries and GPU can do for the config, in the one validation pass.

- huggingface_hub: a feature the installed line cannot send (agrpo/hub_compat.py), where the Jobs are launched.
- trainer.attention: FA3 forced where it cannot run (agrpo/config/attention_choice.py), where the trainer runs.
- vLLM: the limits in the model's own config.json (agrpo/config/vllm_checks.py), when this machine has the file.
`setting_problems` is the pure part (the value is one of the choices), run with the config-only checks.
"""

from __future__ import annotations

from typing import Any


def setting_problems(cfg: Any) -> list[str]:
    from agrpo.config.schema import Attention

    if Attention.parse(cfg.trainer.attention) is None:
        return [f"trainer.attention={cfg.trainer.attention!r} must be one of {list(Attention.values())}"]
    return []


def trainer_runs_here(cfg: Any) -> bool:
    """The trainer is a process of this machine (not the trainer Job of a launch from here)."""
    return not (cfg.launcher.name == "hf_jobs" and cfg.role == "all")


def attention_problems(cfg: Any) -> list[str]:
    if not trainer_runs_here(cfg) or setting_problems(cfg):
        return []
    from agrpo.config.attention_choice import choose_attention, gather_facts

    problem = choose_attention(str(cfg.trainer.attention), gather_facts(cfg)).problem
    return [problem] if problem else []


def machine_problems(cfg: Any) -> list[str]:
    from agrpo.config.vllm_checks import vllm_model_problems
    from agrpo.hub_compat import config_problems as hub_problems

    return hub_problems(cfg) + attention_problems(cfg) + vllm_model_problems(cfg)
