"""Checks of what this machine's libraries and GPU can do for the config, in the one validation pass.

- huggingface_hub: a feature the installed line cannot send (agrpo/hub_compat.py), where the Jobs are launched.
- trainer.attention: FA3 forced where it cannot run (agrpo/config/attention_choice.py), where the trainer runs.
- vLLM: the limits in the model's own config.json (agrpo/config/vllm_checks.py), when this machine has the file.
- the GPU: bf16 forced where it has none, vLLM's CUDA build with no GPU torch sees (agrpo/config/gpu_precision.py).
`setting_problems` is the pure part (the value is one of the choices), run with the config-only checks.
"""

from __future__ import annotations

from omegaconf import DictConfig


def setting_problems(cfg: DictConfig) -> list[str]:
    from agrpo.config.schema import Attention

    if Attention.parse(cfg.trainer.attention) is None:
        return [f"trainer.attention={cfg.trainer.attention!r} must be one of {list(Attention.values())}"]
    return []


def trainer_runs_here(cfg: DictConfig) -> bool:
    """The trainer is a process of this machine (not the trainer Job of a launch from here)."""
    return not (cfg.launcher.name == "hf_jobs" and cfg.role == "all")


def attention_problems(cfg: DictConfig) -> list[str]:
    if not trainer_runs_here(cfg) or setting_problems(cfg):
        return []
    from agrpo.config.attention_choice import choose_attention, gather_facts

    choice = choose_attention(str(cfg.trainer.attention), gather_facts(cfg))
    if choice.problem:
        return [choice.problem]
    if str(cfg.trainer.attention) == "fa3" and choice.kind == "fa3":  # forced: load it now, before anything starts
        from agrpo.errors import ConfigError
        from agrpo.config.attention_choice import load_fa3_kernel, loaded_choice

        try:
            loaded_choice(choice, "fa3", load_fa3_kernel)
        except ConfigError as error:
            return [str(error)]
    return []


def gpu_problems(cfg: DictConfig) -> list[str]:
    """bf16 forced on a GPU without it; vLLM's CUDA build with no GPU torch can see (agrpo/config/gpu_precision.py);
    the plan of this machine's GPUs against agrpo's memory estimates (agrpo/config/gpu_plan.py), from the model's
    config.json fetched if need be (agrpo/config/model_config_fetch.py; one log line when it cannot be had)."""
    from agrpo.config.gpu_precision import local_facts, precision_problems, stack_problems, trainer_memory_problems

    if not trainer_runs_here(cfg):
        return []
    facts = local_facts()
    memory = []
    if facts.cuda:
        from agrpo.config.model_config_fetch import model_config_for_check

        model_config, why = model_config_for_check(str(cfg.model.name_or_path))
        if model_config is None:
            import logging

            logging.getLogger("agrpo").warning("GPU memory check without the model's estimates: %s", why)
        memory = trainer_memory_problems(cfg, facts, model_config)
    return precision_problems(cfg, facts) + stack_problems(cfg, facts) + memory


def machine_problems(cfg: DictConfig) -> list[str]:
    from agrpo.config.vllm_checks import vllm_model_problems
    from agrpo.hub_compat import config_problems as hub_problems

    return hub_problems(cfg) + attention_problems(cfg) + gpu_problems(cfg) + vllm_model_problems(cfg)
