"""The accelerate config file for launcher=accelerate: FSDP2, generated from our config (pure, no I/O).

Why each fixed choice:
- fsdp_version 2 (per-parameter DTensor sharding): TRL's AsyncGRPOTrainer supports FSDP2 only, and its adapter
  save gathers DTensors one parameter at a time.
- TRANSFORMER_BASED_WRAP on the decoder-layer class: one FSDP unit per layer, so only one layer's full weights
  exist at a time; the class comes from the model (`_no_split_modules`, e.g. Qwen2DecoderLayer).
- SHARDED_STATE_DICT: every rank writes its own shard of each checkpoint. A FULL_STATE_DICT of a PEFT model under
  FSDP keeps only rank 0's shard of the adapter and loses the other ranks' learned weights on resume.
"""

from __future__ import annotations

from typing import Any

from agrpo.config.schema import AccelerateConfig

ACCELERATE_CONFIG_FILE = "accelerate_fsdp.yaml"


def layer_cls_from_model_config(model_config: dict[str, Any]) -> str | None:
    """The decoder-layer class(es) to wrap, from a model's config.json: its architecture's `_no_split_modules`."""
    import transformers

    for architecture in model_config.get("architectures") or []:
        modules = getattr(getattr(transformers, architecture, None), "_no_split_modules", None)
        if modules:
            return ",".join(modules)
    return None


def build_fsdp_config(
    knobs: AccelerateConfig, num_processes: int, main_process_port: int | str, layer_cls: str | None, on_cpu: bool
) -> dict[str, Any]:
    """The `accelerate launch --config_file` content for `num_processes` ranks on one machine.

    `knobs` is launcher.accelerate. `layer_cls` None leaves the wrap class to accelerate, which reads the model's
    `_no_split_modules` when it wraps (the same answer, found later). `use_cpu` stays false even on a CPU machine:
    true would make `accelerate launch` start one plain process instead of torchrun's ranks; the launcher sets
    ACCELERATE_USE_CPU for the ranks instead (they then join a gloo group, wrapped in DDP: accelerate 1.15 turns
    FSDP on only for accelerator devices).
    """
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",  # FULL would lose non-zero ranks' adapter shards on resume
        "fsdp_reshard_after_forward": bool(knobs.reshard_after_forward),
        "fsdp_activation_checkpointing": bool(knobs.activation_checkpointing),
        "fsdp_offload_params": bool(knobs.cpu_offload),
        # Every rank loads the (small, LoRA-frozen) base model itself: simpler than rank-0 loading + broadcast, and
        # the path transformers and TRL test most.
        "fsdp_cpu_ram_efficient_loading": False,
    }
    layer = knobs.transformer_layer_cls or layer_cls
    if layer:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": num_processes,
        "main_process_port": main_process_port,
        "rdzv_backend": "static",
        "same_network": True,
        # bf16 autocast on CPU is slow, not leaner; str(): a plain string for yaml.safe_dump, not the Enum member
        "mixed_precision": "no" if on_cpu else str(knobs.mixed_precision),
        "use_cpu": False,
        "downcast_bf16": "no",
        "fsdp_config": fsdp,
    }
