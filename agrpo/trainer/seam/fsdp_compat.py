"""FSDP2 and tied input/output embeddings (TRL-independent; applied by trl_backend when the trainer runs under FSDP).

Models such as Qwen2.5-0.5B share one tensor between `embed_tokens` and `lm_head`. FSDP2 refuses a parameter that
two FSDP groups manage (torch 2.13: "Parameter 'lm_head.weight' is shared with a parameter already managed by
another FSDP group"), which happens as soon as the head and the embeddings land in different units. Giving the head
its own copy removes the sharing. It is exact for LoRA training: both tensors are frozen (LoRA never targets the head
or the embeddings; validation rejects it), so they hold the same values for the whole run; the cost is one more
vocab x hidden tensor, sharded across the ranks. Passing `tie_word_embeddings=False` to `from_pretrained` is not a
substitute: the checkpoint of a tied model has no lm_head weight, so the head would be initialised at random.
"""

from __future__ import annotations

import os
from typing import Any


def running_under_fsdp() -> bool:
    """`accelerate launch` with an FSDP config sets ACCELERATE_USE_FSDP for every rank."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def untie_embeddings(model: Any) -> bool:
    """Give the output embeddings their own copy of tied input embeddings; True when something was untied."""
    import torch

    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None or outputs.weight is not inputs.weight:
        return False
    outputs.weight = torch.nn.Parameter(inputs.weight.detach().clone(), requires_grad=inputs.weight.requires_grad)
    model.config.tie_word_embeddings = False
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.tie_word_embeddings = False
    # transformers re-ties in tie_weights() from `_tied_weights_keys`; with the config flag off it must not.
    return True
