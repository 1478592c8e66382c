"""The trainer's packed ("tree") attention: TRL's FlashAttention-3 kernel where agrpo/config/attention_choice.py
chose it, else agrpo's SDPA.

- `trainer_attention` makes the choice for this process (validation made it first, this guards a machine that
  changed since).
- `varlen_causal_attention`: the same varlen causal attention as FA3's kernel, computed segment by segment with
  PyTorch's SDPA, on any device and dtype; agrpo/trainer/seam/module_patches.py serves it to TRL in FA3's place.
"""

from __future__ import annotations

import torch
from torch.nn.attention.bias import causal_lower_right

from agrpo.config.schema import RunConfig
from agrpo.config.attention_choice import (
    AttentionChoice,
    choose_attention,
    gather_facts,
    load_fa3_kernel,
    loaded_choice,
)


def varlen_causal_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=True,
    window_size=(-1, -1),
    softcap=0.0,
    **_unused,
):
    """Stand-in for `flash_attn_varlen_func`: q is (total_q, heads, dim), k/v are (total_k, kv_heads, dim).

    Segment i attends from q[cu_q[i]:cu_q[i+1]] to k[cu_k[i]:cu_k[i+1]], causal with the bottom-right alignment that
    FlashAttention uses when a query segment is shorter than its key path (the queries are the path's last tokens).
    """
    if window_size not in ((-1, -1), [-1, -1]) or softcap:
        raise NotImplementedError("sliding windows and softcap are not supported by agrpo's SDPA attention")
    outputs = []
    heads, kv_heads = q.shape[1], k.shape[1]
    q_bounds, k_bounds = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()  # one device sync, not two per segment
    for i in range(len(q_bounds) - 1):
        qs, qe, ks, ke = q_bounds[i], q_bounds[i + 1], k_bounds[i], k_bounds[i + 1]
        query = q[qs:qe].transpose(0, 1)  # (heads, Lq, dim)
        key = k[ks:ke].transpose(0, 1)
        value = v[ks:ke].transpose(0, 1)
        if kv_heads != heads:
            key = key.repeat_interleave(heads // kv_heads, dim=0)
            value = value.repeat_interleave(heads // kv_heads, dim=0)
        lq, lk = qe - qs, ke - ks
        # A whole segment (the prompt) is plainly causal; a continuation sees its path's prefix, then itself causally:
        # bottom-right aligned. Both forms let PyTorch pick a fused kernel on a GPU instead of a materialised mask.
        mask = causal_lower_right(lq, lk) if causal and lq != lk else None
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=causal and lq == lk, scale=softmax_scale
        )
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0)


def trainer_attention(cfg: RunConfig) -> AttentionChoice:
    """The choice for this process's trainer, decided by LOADING the kernel, before the model loads: the facts
    (validation's pass) say FA3 could run; only a load says it does (a missing build for this torch/CUDA, a 403/429,
    a blocked download). A forced fa3 that cannot run raises ConfigError; under auto any failure falls back to SDPA."""
    from agrpo.errors import ConfigError

    choice = choose_attention(str(cfg.trainer.attention), gather_facts(cfg))
    if choice.problem:
        raise ConfigError(choice.problem)
    if choice.kind == "fa3":
        choice = loaded_choice(choice, str(cfg.trainer.attention), load_fa3_kernel)
    return choice
