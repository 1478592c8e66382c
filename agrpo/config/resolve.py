"""Resolve once: every "derive me" value (`auto`, None, -1) computed in one place from the config and the machine.

`resolve(cfg, cuda_available)` returns a resolved copy of the config with these values filled in: what
`<run_dir>/config.yaml` should hold, so that every process reads the values the run used instead of deriving them
again. `derived_values` is the table of what was derived (for the dry run and for tests). Pure: the caller passes
the one machine fact needed (does this machine have CUDA).

Left to the launcher's plan, because they depend on the GPUs and cores of the machines a plan assigns:
`trainer.gpus`, `inference.gpus`, `trainer.cpu_threads`, `inference.gpu_memory_utilization` (depends on whether a
replica shares its GPU with the trainer) and `launcher.accelerate.num_processes`. Left to the trainer on a CUDA
machine: `trainer.attention=auto` (its GPU, kernel cache and Hub access decide; agrpo/trainer/attention.py).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from agrpo.trainer.inflight import is_auto

# Ranks vLLM builds LoRA buffers for; a served rank must be one of them (as TRL's round_lora_rank).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def round_lora_rank(rank: int) -> int:
    """Smallest vLLM LoRA capacity that holds an adapter of `rank` (validation has refused ranks above 512)."""
    return next(candidate for candidate in VLLM_LORA_RANKS if candidate >= rank)


def replica_count(cfg: Any) -> int:
    return len(cfg.inference.urls) or cfg.inference.replicas


def inflight_slots(trainer: Any) -> int:
    """Requests TRL's rollout worker may have in flight: the fixed number asked for, or with `auto` the most samples
    the controller may keep ahead of the trainer (it admits fewer; agrpo/trainer/inflight.py)."""
    from agrpo.trainer.inflight import Limits, fixed_inflight

    fixed = fixed_inflight(trainer.max_inflight_tasks)
    if fixed is not None:
        return fixed
    samples_per_step = trainer.per_device_train_batch_size * trainer.gradient_accumulation_steps
    limits = Limits(samples_per_step, trainer.num_generations, trainer.weight_sync_steps, trainer.max_staleness)
    return limits.ceiling


def queue_size(trainer: Any) -> int:
    """The rollout queue: with `auto`, as large as the budget may grow (the budget, not the queue, holds generation
    back); with a fixed number of requests in flight, twice that (generation runs about two steps ahead)."""
    if trainer.queue_maxsize > 0:
        return trainer.queue_maxsize
    slots = inflight_slots(trainer)
    return slots if is_auto(trainer.max_inflight_tasks) else 2 * slots


def derived_values(cfg: Any, cuda_available: bool) -> dict[str, Any]:
    """Dotted key -> derived value, for each key whose config value asks to be derived."""
    inference, trainer = cfg.inference, cfg.trainer
    device = inference.device if inference.device != "auto" else ("cuda" if cuda_available else "cpu")
    derived: dict[str, Any] = {}
    if inference.device == "auto":
        derived["inference.device"] = device
    if inference.dtype == "auto":
        derived["inference.dtype"] = "float32" if device == "cpu" else "bfloat16"
    if inference.max_lora_rank is None:
        derived["inference.max_lora_rank"] = round_lora_rank(cfg.lora.r)
    if inference.max_loras is None:
        derived["inference.max_loras"] = trainer.max_staleness + 2  # every version a rollout may name + the new one
    if inference.use_proxy is None:
        derived["inference.use_proxy"] = replica_count(cfg) > 1
    if trainer.bf16 is None:
        derived["trainer.bf16"] = device == "cuda"
    if trainer.attention == "auto" and not cuda_available:
        derived["trainer.attention"] = "sdpa"  # FA3 needs CUDA (agrpo/trainer/attention.py)
    if trainer.queue_maxsize == -1:  # max_inflight_tasks=auto stays: the controller decides it at run time
        derived["trainer.queue_maxsize"] = queue_size(trainer)
    if trainer.token_budget is None:
        derived["trainer.token_budget"] = inference.max_model_len
    if cfg.eval.max_tokens is None:
        derived["eval.max_tokens"] = trainer.max_completion_length
    return derived


def resolve(cfg: Any, cuda_available: bool) -> DictConfig:
    """A copy of `cfg` with every interpolation resolved and every derived value filled in."""
    from agrpo.config.schema import RunConfig

    resolved = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.to_container(cfg, resolve=True))
    for key, value in derived_values(resolved, cuda_available).items():
        OmegaConf.update(resolved, key, value, merge=False)
    return resolved
