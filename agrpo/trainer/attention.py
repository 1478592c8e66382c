"""Which attention the trainer's packed ("tree") sequences use: TRL's FlashAttention-3 kernel, or agrpo's SDPA.

TRL 1.16 loads the policy with attn_implementation="tree_fa3", whose kernel (kernels-community/flash-attn3, major
version 1) comes from the Hub through the `kernels` package and is built for CUDA compute capability 8.x and 9.0, in
bf16/fp16 only. Anywhere else (no GPU, a T4/V100/Blackwell, fp32 queries, an offline machine without the kernel in
its cache) it fails at the first step. So the choice is made before the run from the machine's facts:

- `choose_attention` (pure) decides from `AttentionFacts`: `trainer.attention=auto` takes FA3 where it can work and
  SDPA otherwise; `fa3` where it cannot is a config error (exit 2, naming the reason); `sdpa` is always possible.
- `gather_facts` (I/O) reads them: CUDA and its compute capability, the precision the queries will have, whether
  `kernels` is installed, the kernel in the local cache, the Hub offline or unreachable (probed only when it matters).
- `use_sdpa_tree_attention` swaps TRL's kernel loader for `varlen_causal_attention`: the same varlen causal
  attention computed segment by segment with PyTorch's SDPA, on any device and dtype.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch.nn.attention.bias import causal_lower_right

from agrpo.config.schema import Attention

FA3_REPO, FA3_VERSION = "kernels-community/flash-attn3", 1  # what TRL 1.16's packing._flash_attn loads
ROCM_REPO, ROCM_VERSION = "kernels-community/aiter-flash-attn", 2  # ... and what it loads on ROCm instead
# The kernel's builds (its build.toml): sm_80 code, which every 8.x GPU runs, and sm_90a, which only 9.0 runs.
FA3_CAPABILITY_MAJORS, FA3_EXACT_CAPABILITIES = (8,), ((9, 0),)
CHOICES = Attention.values()  # trainer.attention's names: the schema's
HALF_DTYPES = ("bfloat16", "float16", "bf16", "fp16", "half")


@dataclass(frozen=True)
class AttentionFacts:
    """What decides whether FA3 can run. `hub_reachable` is None when it was not probed (it did not matter)."""

    cuda: bool
    capability: tuple[int, int] | None = None
    half_precision: bool = True  # the queries reach attention in bf16/fp16
    kernels_installed: bool = True
    kernel_cached: bool = False
    hub_offline: bool = False
    hub_reachable: bool | None = None
    rocm: bool = False  # TRL loads another kernel there (aiter); the capability rule does not apply


@dataclass(frozen=True)
class AttentionChoice:
    kind: str  # "fa3" | "sdpa"
    reason: str  # why, for the banner
    problem: str | None = None  # set when trainer.attention=fa3 was asked for and cannot work

    @property
    def banner(self) -> str:
        if self.kind == "fa3":
            return f"FlashAttention-3 (TRL's Hub kernel {FA3_REPO}; {self.reason})"
        return f"SDPA packed attention (agrpo's; {self.reason})"


def fa3_blockers(facts: AttentionFacts) -> list[str]:
    """Every reason FA3 cannot run on this machine, in the order a user would fix them."""
    if not facts.cuda:
        return ["no CUDA GPU"]
    blockers = []
    cap = facts.capability
    supported = cap is not None and (cap[0] in FA3_CAPABILITY_MAJORS or tuple(cap) in FA3_EXACT_CAPABILITIES)
    if not facts.rocm and not supported:
        where = f"{cap[0]}.{cap[1]}" if cap else "unknown"
        blockers.append(f"GPU compute capability {where} (the kernel is built for 8.x and 9.0: A100/A10/L4/H100/H200)")
    if not facts.half_precision:
        blockers.append("fp32 queries (trainer.bf16=false with model.dtype=float32; the kernel takes bf16/fp16 only)")
    if not facts.kernels_installed:
        blockers.append("the `kernels` package is not installed (pip install -e .[gpu])")
    elif not facts.kernel_cached and facts.hub_offline:
        blockers.append(f"{FA3_REPO} is not in the local cache and HF_HUB_OFFLINE is set")
    elif not facts.kernel_cached and facts.hub_reachable is False:
        blockers.append(f"{FA3_REPO} is not in the local cache and the Hub cannot be reached")
    return blockers


def choose_attention(requested: str, facts: AttentionFacts) -> AttentionChoice:
    """The attention to use for `trainer.attention=requested` on a machine with these facts (pure)."""
    if requested not in CHOICES:
        problem = f"trainer.attention={requested!r} must be one of {list(CHOICES)}"
        return AttentionChoice("sdpa", "invalid setting", problem)
    if requested == "sdpa":
        return AttentionChoice("sdpa", "trainer.attention=sdpa")
    blockers = fa3_blockers(facts)
    if not blockers:
        where = "cached kernel" if facts.kernel_cached else "kernel fetched from the Hub"
        return AttentionChoice("fa3", f"{where}, trainer.attention={requested}")
    if requested == "fa3":
        problem = (
            f"trainer.attention=fa3 cannot run here: {'; '.join(blockers)}. Set trainer.attention=auto (or sdpa) "
            "to use agrpo's SDPA packed attention, or fix the above"
        )
        return AttentionChoice("sdpa", "FA3 refused", problem)
    return AttentionChoice("sdpa", f"FA3 not usable: {'; '.join(blockers)}")


def queries_in_half_precision(cfg: Any, cuda: bool) -> bool:
    """TRL autocasts to bf16 when trainer.bf16 is on (None: on a GPU), else queries keep the model's dtype."""
    extra = cfg.trainer.extra or {}
    bf16 = cuda if cfg.trainer.bf16 is None else bool(cfg.trainer.bf16)
    return bf16 or bool(extra.get("fp16")) or str(cfg.model.dtype) in HALF_DTYPES


def kernel_in_cache(repo_id: str = FA3_REPO, version: int = FA3_VERSION, cache_dir: str | None = None) -> bool:
    """The kernel's version branch is in the local Hub cache with its snapshot, as `kernels` looks it up offline
    (both cache layouts it accepts: `kernels--org--name` and the older `models--org--name`)."""
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = os.environ.get("KERNELS_CACHE") or constants.HF_HUB_CACHE
    for prefix in ("kernels", "models"):
        folder = Path(cache_dir) / f"{prefix}--{repo_id.replace('/', '--')}"
        ref = folder / "refs" / f"v{version}"
        if ref.is_file() and (folder / "snapshots" / ref.read_text().strip()).is_dir():
            return True
    return False


def hub_answers(timeout_s: float = 3.0) -> bool:
    """Whether the Hub's endpoint answers at all within `timeout_s` (any HTTP status counts)."""
    import requests

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    try:
        requests.head(endpoint, timeout=timeout_s)
        return True
    except requests.RequestException:
        return False


def gather_facts(cfg: Any, probe_hub: Callable[[], bool] = hub_answers) -> AttentionFacts:
    """This machine's facts for the trainer of `cfg`; the Hub is probed only when nothing else rules FA3 out."""
    import importlib.util

    cuda = torch.cuda.is_available()
    if not cuda:
        return AttentionFacts(cuda=False, half_precision=queries_in_half_precision(cfg, False))
    from huggingface_hub import constants

    rocm = bool(torch.version.hip)
    facts = AttentionFacts(
        cuda=True,
        capability=tuple(torch.cuda.get_device_capability(0)),
        half_precision=queries_in_half_precision(cfg, True),
        kernels_installed=importlib.util.find_spec("kernels") is not None,
        kernel_cached=kernel_in_cache(*((ROCM_REPO, ROCM_VERSION) if rocm else (FA3_REPO, FA3_VERSION))),
        hub_offline=bool(constants.HF_HUB_OFFLINE),
        rocm=rocm,
    )
    if facts.kernel_cached or facts.hub_offline or fa3_blockers(facts):
        return facts
    return AttentionFacts(**{**facts.__dict__, "hub_reachable": probe_hub()})


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


def use_sdpa_tree_attention() -> None:
    """TRL's tree attention calls `packing._flash_attn().flash_attn_varlen_func`: serve it ours instead."""
    from agrpo.trainer.trl_patches import require

    packing = require("trl.experimental.async_grpo.packing", "_flash_attn")
    kernel = SimpleNamespace(flash_attn_varlen_func=varlen_causal_attention)
    packing._flash_attn = lambda: kernel


def trainer_attention(cfg: Any) -> AttentionChoice:
    """The choice for this process's trainer; a forced fa3 that cannot run raises ConfigError (validation says so
    first, this guards a machine that changed since)."""
    from agrpo.errors import ConfigError

    choice = choose_attention(str(cfg.trainer.attention), gather_facts(cfg))
    if choice.problem:
        raise ConfigError(choice.problem)
    return choice
