"""One GPU memory planner for the processes of one machine (issue 45): where each goes, and whether they fit (pure).

Before, the trainer's estimate was checked only for the default one-GPU plan, and each replica's share alone, so
`inference.gpus=[0,0] trainer.gpus=[0]` on one GPU (two replicas at 0.35 each beside a trainer needing ~35 GiB) was
accepted and ran out of memory. Here every GPU of the plan is summed: the trainer's estimate where it trains (each
rank's, under accelerate), plus, for each replica on it, the fraction vLLM is given (`--gpu-memory-utilization`)
and REPLICA_OUTSIDE_GIB its process holds outside that fraction (CUDA context, graphs); and each replica's fraction
must hold its own weights, KV cache for one full sequence and activations. The GPUs are taken as alike (GPU 0's
memory for each): agrpo plans one machine of one card type.

`place` mirrors the local plan's split (agrpo/launchers/gpus.py: replicas on the last GPUs, one trainer process on
the first of the rest; spares of an auto fleet included); tests/config/test_gpu_plan_topologies.py builds the real
plan of every accepted case and checks it against this. Advice for a refusal is searched in agrpo/config/gpu_advice.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agrpo.config.memory_estimate import GIB, estimate, parameter_count, trainer_tokens

REPLICA_OUTSIDE_GIB = 1.0  # a replica's CUDA context and graphs, outside the fraction vLLM sizes its KV cache in
REPLICA_INSIDE_GIB = 1.0  # vLLM's profiling peak (activations, sampler logits for up to 256 sequences), inside it


@dataclass(frozen=True)
class Placement:
    trainer: tuple[int, ...]  # the trainer's GPUs (one per rank)
    replicas: tuple[tuple[int, ...], ...]  # each replica's GPUs, spares included
    fractions: tuple[float, ...]  # each replica's --gpu-memory-utilization


@dataclass(frozen=True)
class Needs:
    trainer: float | None  # bytes per trainer rank (None: no config.json, not checked)
    replica: float | None  # bytes a replica needs inside its fraction, per GPU
    trainer_detail: str = ""  # what the trainer's estimate is made of


def fleet_slots(inference: Any) -> int:
    """Replica slots the plan gives GPUs to: the fixed number, or max_replicas with `auto` (spares included)."""
    if str(inference.replicas).strip().lower() == "auto":
        return int(inference.max_replicas)
    return int(inference.replicas)


def replicas_start_here(cfg: Any) -> bool:
    return cfg.role == "all" and not cfg.inference.urls


def replica_key(inference: Any) -> str:
    """The key a user changes for the number of replica slots."""
    return "inference.max_replicas" if str(inference.replicas).strip().lower() == "auto" else "inference.replicas"


def replica_fraction(setting: float | None, shares_with_trainer: bool) -> float:
    """The replica's --gpu-memory-utilization: the rule of agrpo/inference/vllm_server.py (add_gpu_settings)."""
    from agrpo.config.resolve import DEDICATED_GPU_MEMORY, SHARED_GPU_MEMORY

    if setting is not None:
        return float(setting)
    return SHARED_GPU_MEMORY if shares_with_trainer else DEDICATED_GPU_MEMORY


def place(cfg: Any, count: int) -> Placement | str:
    """The GPUs of the trainer and of each replica on a machine of `count` GPUs, or why the split is impossible."""
    inference, trainer = cfg.inference, cfg.trainer
    slots = fleet_slots(inference) if replicas_start_here(cfg) else 0
    per = int(inference.gpus_per_replica)
    needed = slots * per
    replica_gpus = list(inference.gpus) if inference.gpus else None
    if slots and replica_gpus is None:
        if count == 1 and needed == 1:
            replica_gpus = [0]
        elif needed >= count:
            auto = replica_key(inference) == "inference.max_replicas"
            return f"{slots} replica slot(s) x {per} GPU(s) leave none of the {count} GPU(s) for the trainer" + (
                f" (inference.replicas=auto gives each of inference.max_replicas={slots} slots a GPU)" if auto else ""
            )
        else:
            replica_gpus = list(range(count - needed, count))
    replica_gpus = replica_gpus or []
    if slots and len(replica_gpus) != needed:
        return f"inference.gpus lists {len(replica_gpus)} GPUs but {slots} replica slot(s) x {per} = {needed}"
    trainer_gpus = list(trainer.gpus) if trainer.gpus else [g for g in range(count) if g not in replica_gpus] or [0]
    wrong = [g for g in [*trainer_gpus, *replica_gpus] if not 0 <= int(g) < count]
    if wrong:
        return f"GPU {wrong[0]} does not exist on this machine ({count} GPUs)"
    if len(trainer_gpus) > 1 and cfg.launcher.name != "accelerate":
        if trainer.gpus:
            return (
                f"trainer.gpus={trainer_gpus} gives a one-process trainer several GPUs (launcher=accelerate uses them)"
            )
        trainer_gpus = trainer_gpus[:1]
    replicas = tuple(tuple(replica_gpus[i * per : (i + 1) * per]) for i in range(slots))
    fractions = tuple(
        replica_fraction(inference.gpu_memory_utilization, bool(set(gpus) & set(trainer_gpus))) for gpus in replicas
    )
    return Placement(tuple(trainer_gpus), replicas, fractions)


def training_dtype_bytes(cfg: Any, bf16_supported: bool) -> int:
    half = cfg.trainer.bf16 is True or (cfg.trainer.bf16 is None and bf16_supported)
    return 2 if half or str(cfg.model.dtype) in ("bfloat16", "float16") else 4


def needs_of(cfg: Any, model_config: dict[str, Any] | None, bf16_supported: bool = True) -> Needs:
    """What one trainer rank (agrpo/config/memory_estimate.py) and one replica need; None without config.json."""
    found = None
    if model_config is not None:
        tokens = trainer_tokens(cfg.trainer, cfg.inference.max_model_len)
        found = estimate(model_config, tokens, training_dtype_bytes(cfg, bf16_supported), recomputes_activations(cfg))
    if found is None:
        return Needs(None, replica_need(cfg, model_config))
    detail = (
        f" for {tokens:,} tokens a micro-step (weights {found.weights / GIB:.1f}, activations "
        f"{found.activations / GIB:.1f}, logits {found.logits / GIB:.1f} GiB)"
    )
    return Needs(found.total, replica_need(cfg, model_config), detail)


def recomputes_activations(cfg: Any) -> bool:
    """trainer.gradient_checkpointing, or under accelerate FSDP's own activation checkpointing."""
    fsdp = cfg.launcher.name == "accelerate" and bool(cfg.launcher.accelerate.activation_checkpointing)
    return bool(cfg.trainer.gradient_checkpointing) or fsdp


def replica_need(cfg: Any, model_config: dict[str, Any] | None) -> float | None:
    """Bytes a replica needs inside its fraction, per GPU: weights and LoRA slots split over its tensor-parallel
    GPUs, the KV cache of one sequence of inference.max_model_len (vLLM refuses to start without it), and
    REPLICA_INSIDE_GIB for its profiling peak. In the served dtype (float32: 4 bytes; else 2)."""
    params = parameter_count(model_config) if model_config else None
    if params is None:
        return None
    width = 4 if str(cfg.inference.dtype) == "float32" else 2
    hidden, layers = int(model_config["hidden_size"]), int(model_config["num_hidden_layers"])
    heads = int(model_config.get("num_attention_heads") or 1)
    kv_heads = int(model_config.get("num_key_value_heads") or heads)
    head_dim = int(model_config.get("head_dim") or hidden // heads)
    kv = 2 * layers * kv_heads * head_dim * width * int(cfg.inference.max_model_len)
    inter = int(model_config.get("intermediate_size") or 4 * hidden)
    rank = int(cfg.inference.max_lora_rank or max(8, int(cfg.lora.r)))
    slots = int(cfg.inference.max_loras or int(cfg.trainer.max_staleness) + 2)
    lora = slots * rank * layers * (8 * hidden + 3 * (hidden + inter)) * width
    return (params * width + lora) / int(cfg.inference.gpus_per_replica) + kv + REPLICA_INSIDE_GIB * GIB


def gpu_use(placement: Placement, gpu: int, memory: float, trainer: float | None) -> float:
    """Bytes the plan puts on `gpu`: its replicas' fractions and outside memory, and the trainer rank on it."""
    used = sum(
        f * memory + REPLICA_OUTSIDE_GIB * GIB
        for gpus, f in zip(placement.replicas, placement.fractions)
        if gpu in gpus
    )
    return used + (trainer or 0.0) * (gpu in placement.trainer)


def fit_problems(placement: Placement, memory: float, name: str, needs: Needs, cfg: Any) -> list[str]:
    """What does not fit: a replica's fraction below its own need, a shared replica above MAX_SHARED_GPU_MEMORY,
    any GPU whose processes add up to more than its memory."""
    from agrpo.config.resolve import MAX_SHARED_GPU_MEMORY

    problems = []
    for index, (gpus, fraction) in enumerate(zip(placement.replicas, placement.fractions)):
        if needs.replica is not None and fraction * memory < needs.replica:
            problems.append(
                f"replica {index} gets {fraction:.2f} of {name} ({fraction * memory / GIB:.1f} GiB) but needs "
                f"~{needs.replica / GIB:.1f} GiB for its weights, LoRA slots and one {cfg.inference.max_model_len}-"
                "token sequence's KV cache"
            )
        if set(gpus) & set(placement.trainer) and fraction > MAX_SHARED_GPU_MEMORY:
            problems.append(
                f"replica {index} would take {fraction:.2f} of the GPU it shares with the trainer "
                f"(at most {MAX_SHARED_GPU_MEMORY}: the trainer needs the rest)"
            )
    for gpu in sorted({g for gpus in placement.replicas for g in gpus} | set(placement.trainer)):
        used = gpu_use(placement, gpu, memory, needs.trainer)
        if used > memory:
            problems.append(over_line(placement, gpu, memory, name, needs, used))
    return problems


def over_line(placement: Placement, gpu: int, memory: float, name: str, needs: Needs, used: float) -> str:
    shares = [f"{f:.2f}" for gpus, f in zip(placement.replicas, placement.fractions) if gpu in gpus]
    parts = [f"{len(shares)} replica(s) at {' + '.join(shares)} of it (+{REPLICA_OUTSIDE_GIB:.0f} GiB each outside)"]
    parts = parts if shares else []
    if gpu in placement.trainer and needs.trainer is not None:
        parts.append(f"the trainer's ~{needs.trainer / GIB:.1f} GiB{needs.trainer_detail} (an estimate)")
    return f"GPU {gpu} ({name}, {memory / GIB:.1f} GiB) would hold {' and '.join(parts)}: ~{used / GIB:.1f} GiB"


def plan_problems(cfg: Any, count: int, memory: float, name: str, needs: Needs) -> list[str]:
    """Why this machine's plan for `cfg` cannot run (empty: it fits by the estimates)."""
    placement = place(cfg, max(count, 1))
    if isinstance(placement, str):
        return [placement]
    return fit_problems(placement, memory, name, needs, cfg)
