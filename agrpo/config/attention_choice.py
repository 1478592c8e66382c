"""Which attention the trainer's packed ("tree") sequences can use on this machine, decided before the run.

TRL 1.16 loads the policy with attn_implementation="tree_fa3", whose kernel (kernels-community/flash-attn3, major
version 1) comes from the Hub through the `kernels` package and is built for CUDA compute capability 8.x and 9.0, in
bf16/fp16 only. Anywhere else (no GPU, a T4/V100/Blackwell, fp32 queries, an offline machine without the kernel in
its cache) it fails at the first step. So the choice is made from the machine's facts, in the validation pass
(agrpo/config/machine_checks.py) and again by the trainer (agrpo/trainer/seam/attention.py, which also holds the SDPA
kernel used when FA3 is not chosen):

- `choose_attention` (pure) decides from `AttentionFacts`: `trainer.attention=auto` takes FA3 where it can work and
  SDPA otherwise; `fa3` where it cannot is a config error (exit 2, naming the reason); `sdpa` is always possible.
- `gather_facts` (I/O) reads them: CUDA and its compute capability, the precision the queries will have, whether
  `kernels` is installed, the kernel in the local cache, the Hub offline or unreachable (probed only when it matters).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from agrpo.config.schema import Attention, RunConfig

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


def queries_in_half_precision(cfg: DictConfig | RunConfig, cuda: bool) -> bool:
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


def gather_facts(cfg: DictConfig | RunConfig, probe_hub: Callable[[], bool] = hub_answers) -> AttentionFacts:
    """This machine's facts for the trainer of `cfg`; the Hub is probed only when nothing else rules FA3 out."""
    import importlib.util

    import torch

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


def load_fa3_kernel() -> Any:
    """The kernel TRL's packed attention loads (`packing._flash_attn`: the `kernels` package's public `get_kernel`,
    same repo and version; tests/trainer/test_attention.py checks TRL still names them), loaded once now through the
    public call rather than TRL's private loader: fetched into the Hub cache, so no later step downloads or fails."""
    import torch
    from kernels import get_kernel

    repo, version = (ROCM_REPO, ROCM_VERSION) if torch.version.hip else (FA3_REPO, FA3_VERSION)
    kernel = get_kernel(repo, version=version)
    if not callable(getattr(kernel, "flash_attn_varlen_func", None)):
        raise RuntimeError("the loaded kernel has no flash_attn_varlen_func")
    return kernel


def loaded_choice(choice: AttentionChoice, setting: str, load: Callable[[], Any]) -> AttentionChoice:
    """FA3 if `load()` works; else SDPA with one line saying why (auto), or a ConfigError naming the failure (fa3)."""
    import logging

    from agrpo.errors import ConfigError

    try:
        load()
    except Exception as error:  # any failure to fetch or load the kernel: the kernels package raises many kinds
        why = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else 'no message'}"
        if setting == "fa3":
            raise ConfigError(
                f"trainer.attention=fa3, but TRL's FlashAttention-3 kernel did not load ({why}): set "
                "trainer.attention=auto (SDPA where FA3 does not load) or sdpa"
            ) from None
        logging.getLogger("agrpo").warning("FlashAttention-3 did not load (%s): the trainer uses SDPA", why)
        return AttentionChoice("sdpa", f"FA3 did not load: {why}")
    return choice
