"""A published adapter in two halves: its tensors copied on the trainer's thread, its files written off it.

TRL's `save_lora_adapter` gathers the adapter's tensors (a collective under FSDP) and writes the folder in one call,
on the trainer's critical path; on a bucket mount a write can take longer than the gather. With background sync the
trainer only takes the snapshot (copies: the optimizer changes the live tensors in place at the next step), and the
sync thread writes it the way TRL does: a dot-prefixed staging folder (`.trl-policy-vN.tmp`, which resume cleans
up), `adapter_config.json` and `adapter_model.safetensors` as peft writes them, then one atomic rename, so a replica
never sees a half-written adapter. tests/trainer/sync/test_adapter_snapshot.py checks the files match peft's own save.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass
from typing import Any

ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass
class AdapterSnapshot:
    """The adapter at one step: peft's saved form of its tensors, and a frozen copy of its config."""

    tensors: dict[str, Any]
    config: Any

    def write(self, dest_dir: str) -> None:
        """Publish to `dest_dir` with an atomic rename (safe to call from another thread)."""
        from safetensors.torch import save_file

        staging = os.path.join(os.path.dirname(dest_dir), f".{os.path.basename(dest_dir)}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        self.config.save_pretrained(staging)
        save_file(self.tensors, os.path.join(staging, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        shutil.rmtree(dest_dir, ignore_errors=True)
        os.rename(staging, dest_dir)  # atomic within one filesystem


def snapshot_adapter(model: Any, accelerator: Any, adapter_name: str) -> AdapterSnapshot | None:
    """Copy the adapter's tensors now. Every rank calls it (gathering a sharded tensor is a collective); the main
    process gets the snapshot, the others None."""
    from peft.utils import get_peft_model_state_dict
    from torch.distributed.tensor import DTensor

    gathered = {}
    for name, param in model.state_dict().items():
        if "lora_" not in name or f".{adapter_name}." not in name:
            continue
        if isinstance(param, DTensor):  # FSDP2: all-gather this one parameter
            param = param.to(accelerator.device).full_tensor() if param.device.type == "cpu" else param.full_tensor()
        gathered[name] = param.detach().to("cpu", copy=True).contiguous()
    if not accelerator.is_main_process:
        return None
    tensors = get_peft_model_state_dict(model, state_dict=gathered, adapter_name=adapter_name)
    config = copy.deepcopy(model.peft_config[adapter_name])
    config.inference_mode = True  # as peft's save_pretrained writes it
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = getattr(model.base_model.model, "name_or_path", None)
    return AdapterSnapshot({k: v.contiguous() for k, v in tensors.items()}, config)
