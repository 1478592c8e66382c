"""agrpo's patches of TRL's module functions (agrpo/trainer/seam/module_patches.py): each patched TRL attribute still
exists (fails if TRL moves it), forcing them patches every one, the SDPA packed attention computes what
FlashAttention's varlen kernel computes; the client class TRL builds is agrpo's for the span, then TRL's again."""

import importlib

import pytest
import torch

from agrpo.trainer.seam import attention
from agrpo.trainer.seam import module_patches


@pytest.mark.parametrize(
    ("module", "attribute"),
    [
        ("trl.trainer.utils", "get_peak_flops_per_device"),
        ("trl.experimental.async_grpo.async_grpo_trainer", "get_peak_flops_per_device"),
        ("trl.experimental.async_grpo.async_rollout_worker", "is_vllm_available"),
        ("trl.experimental.async_grpo.packing", "_flash_attn"),
    ],
)
def test_patched_trl_attributes_still_exist(module, attribute):
    assert hasattr(importlib.import_module(module), attribute), f"TRL moved {module}.{attribute}"


def test_trl_still_calls_cuda_for_flops():
    """If TRL stops calling torch.cuda here, the FLOPs patch can go."""
    import inspect

    from trl.trainer import utils

    module_source = inspect.getsource(utils)  # the file, not the attribute: another test may have patched it already
    function_source = module_source.split("def get_peak_flops_per_device", 1)[1].split("\ndef ", 1)[0]
    assert "torch.cuda.get_device_name" in function_source


def test_apply_forced_patches_every_attribute():
    applied = module_patches.apply_trl_patches("sdpa", force_cpu=True)
    assert {"flops", "sdpa_attention"} <= set(applied)
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    assert async_grpo_trainer.get_peak_flops_per_device(None, "float32") is None
    assert packing._flash_attn().flash_attn_varlen_func is attention.varlen_causal_attention


def reference_attention(q, k, v, q_lens, k_lens, kv_index, heads_per_kv):
    """Dense per-segment causal attention with explicit bottom-right masking, written independently of the patch."""
    out, qs, ks = [], 0, 0
    keys, values = k[kv_index], v[kv_index]
    for lq, lk in zip(q_lens, k_lens):
        query = q[qs : qs + lq]  # (lq, H, D)
        key = keys[ks : ks + lk].repeat_interleave(heads_per_kv, dim=1)
        value = values[ks : ks + lk].repeat_interleave(heads_per_kv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query, key) / query.shape[-1] ** 0.5
        for i in range(lq):
            scores[:, i, lk - lq + i + 1 :] = float("-inf")
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), value))
        qs, ks = qs + lq, ks + lk
    return torch.cat(out)


def test_varlen_attention_matches_dense_reference():
    torch.manual_seed(0)
    heads, kv_heads, dim, total = 4, 2, 32, 12
    q = torch.randn(total, heads, dim)
    k = torch.randn(total, kv_heads, dim)
    v = torch.randn(total, kv_heads, dim)
    # A tree: segment 0 = tokens 0..5 (shared prompt), segment 1 = 6..8 continuing it, segment 2 = 9..11 too.
    q_lens, paths = [6, 3, 3], [list(range(0, 6)), list(range(0, 9)), [*range(0, 6), 9, 10, 11]]
    kv_index = torch.tensor([i for path in paths for i in path])
    cu_q = torch.tensor([0, 6, 9, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 15, 24], dtype=torch.int32)
    got = attention.varlen_causal_attention(
        q, k.index_select(0, kv_index), v.index_select(0, kv_index), cu_q, cu_k, 6, 9, causal=True
    )
    want = reference_attention(q, k, v, q_lens, [len(p) for p in paths], kv_index, heads // kv_heads)
    assert got.shape == (total, heads, dim)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_trl_builds_agrpos_client_for_the_span_and_its_own_after():
    from trl.experimental.async_grpo import async_grpo_trainer

    from agrpo.trainer.seam.client import AgrpoVLLMClient

    trl_client = async_grpo_trainer.VLLMClient
    with module_patches.building_client(AgrpoVLLMClient):
        assert async_grpo_trainer.VLLMClient is AgrpoVLLMClient
    assert async_grpo_trainer.VLLMClient is trl_client and trl_client is not AgrpoVLLMClient
