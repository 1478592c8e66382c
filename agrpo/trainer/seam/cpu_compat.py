"""Workarounds that let TRL 1.16's AsyncGRPOTrainer run without CUDA (applied by module_patches.py).

Applied only when it is needed; it touches named attributes of TRL, listed in agrpo/trl_compat.py (`require`):
FLOPs accounting: `trl.trainer.utils.get_peak_flops_per_device` calls `torch.cuda.get_device_name` unconditionally.
On CPU there is no peak to compare against, so MFU is disabled (returns None), as TRL itself does for unknown devices.
(TRL's own rollout worker also refused to start without an importable `vllm` package; agrpo's worker,
agrpo/trainer/rollout/worker.py, speaks HTTP only and has no such guard to lift.)
Packed ("tree") attention, which TRL fetches as a FlashAttention-3 kernel from the Hub, is chosen per machine in
agrpo/trainer/seam/attention.py (SDPA on CPU).
"""

from __future__ import annotations

import logging

import torch

from agrpo.trl_compat import require

log = logging.getLogger(__name__)
_applied: list[str] = []


def _patch_flops() -> None:
    utils = require("trl.trainer.utils", "get_peak_flops_per_device")
    trainer_module = require("trl.experimental.async_grpo.async_grpo_trainer", "get_peak_flops_per_device")

    def no_peak_flops(accelerator, dtype):  # same signature as TRL's
        return None

    utils.get_peak_flops_per_device = no_peak_flops
    trainer_module.get_peak_flops_per_device = no_peak_flops
    _applied.append("flops")


def apply_cpu_workarounds(force: bool = False) -> list[str]:
    """Apply what this machine needs and return the names applied (idempotent). `force` applies all (for tests)."""
    if (force or not torch.cuda.is_available()) and "flops" not in _applied:
        _patch_flops()
    if _applied:
        log.info("CPU workarounds for TRL active: %s", ", ".join(_applied))
    return list(_applied)
