"""Workarounds that let TRL 1.16's AsyncGRPOTrainer run on a machine without CUDA.

Each patch is applied only when it is needed (no GPU, or no importable `vllm` in the trainer's environment), touches
one named attribute of TRL, and checks that the attribute still exists first, so a TRL upgrade that moves it fails
loudly here (and in tests/trainer/test_cpu_compat.py) instead of silently running unpatched:

1. FLOPs accounting: `trl.trainer.utils.get_peak_flops_per_device` calls `torch.cuda.get_device_name`
   unconditionally. On CPU there is no peak to compare against, so MFU is disabled (returns None), as TRL itself does
   for unknown devices.
2. The rollout worker refuses to start unless a package named `vllm` is importable, although it only speaks HTTP to
   the server. A trainer-only environment (the server runs elsewhere) gets the guard lifted.
3. Packed ("tree") attention fetches a FlashAttention-3 kernel from the Hub, which needs CUDA and a network. On CPU
   the same varlen causal attention is computed with PyTorch's SDPA, segment by segment.

Two fixes apply on every machine (the patches here that are not about CPU):
4. Stopping the rollout worker at the end of training took 15 s in every run ("Child did not exit within 15s;
   terminating"): the child had put scored samples on a multiprocessing queue nobody reads any more, and a process
   cannot exit until its queue's feeder thread has flushed them into the pipe. `stop` now drains the queues while it
   waits, so the child exits as soon as its loops end.
5. agrpo's proxy refuses state changes (adapter loads, pause, resume) without its admin token, which the launcher
   hands to the trainer alone in AGRPO_PROXY_ADMIN_TOKEN; a replica the trainer talks to directly refuses every
   request without its API key (AGRPO_REPLICA_API_KEY, agrpo/inference/replica_guard.py). TRL's VLLMClient calls
   `requests.get/post` directly, so the module it calls through gets a stand-in whose calls carry
   `Authorization: Bearer <token>`.
6. The rollout worker's loop is agrpo's subclass (agrpo/trainer/rollout_loop.py): the same token on its requests,
   rollouts of a retired adapter version dropped at once instead of retried for minutes, its log in trainer.log.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from types import SimpleNamespace

import torch

log = logging.getLogger(__name__)
_applied: list[str] = []


def _require(module_name: str, attribute: str):
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise RuntimeError(
            f"agrpo's CPU workaround expects `{module_name}.{attribute}` (TRL 1.16). TRL changed underneath: "
            "update agrpo/trainer/cpu_compat.py for the installed version."
        )
    return module


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
    """CPU stand-in for `flash_attn_varlen_func`: q is (total_q, heads, dim), k/v are (total_k, kv_heads, dim).

    Segment i attends from q[cu_q[i]:cu_q[i+1]] to k[cu_k[i]:cu_k[i+1]], causal with the bottom-right alignment that
    FlashAttention uses when a query segment is shorter than its key path (the queries are the path's last tokens).
    """
    if window_size not in ((-1, -1), [-1, -1]) or softcap:
        raise NotImplementedError("sliding windows and softcap are not supported by agrpo's CPU attention")
    outputs = []
    heads, kv_heads = q.shape[1], k.shape[1]
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        ks, ke = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        query = q[qs:qe].transpose(0, 1)  # (heads, Lq, dim)
        key = k[ks:ke].transpose(0, 1)
        value = v[ks:ke].transpose(0, 1)
        if kv_heads != heads:
            key = key.repeat_interleave(heads // kv_heads, dim=0)
            value = value.repeat_interleave(heads // kv_heads, dim=0)
        mask = None
        if causal:
            lq, lk = qe - qs, ke - ks
            rows = torch.arange(lq).unsqueeze(1) + (lk - lq)
            mask = torch.arange(lk).unsqueeze(0) <= rows
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=softmax_scale)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0)


def _patch_flops() -> None:
    utils = _require("trl.trainer.utils", "get_peak_flops_per_device")
    trainer_module = _require("trl.experimental.async_grpo.async_grpo_trainer", "get_peak_flops_per_device")

    def no_peak_flops(accelerator, dtype):  # noqa: ARG001 - same signature as TRL's
        return None

    utils.get_peak_flops_per_device = no_peak_flops
    trainer_module.get_peak_flops_per_device = no_peak_flops
    _applied.append("flops")


def _patch_vllm_guard() -> None:
    worker = _require("trl.experimental.async_grpo.async_rollout_worker", "is_vllm_available")
    worker.is_vllm_available = lambda *args, **kwargs: True
    _applied.append("vllm_guard")


def _patch_tree_attention() -> None:
    packing = _require("trl.experimental.async_grpo.packing", "_flash_attn")
    kernel = SimpleNamespace(flash_attn_varlen_func=varlen_causal_attention)
    packing._flash_attn = lambda: kernel
    _applied.append("tree_attention")


def _patch_drain_on_stop() -> None:
    import queue
    import threading

    module = _require("trl.experimental.async_grpo.async_rollout_worker", "AsyncRolloutWorker")
    stop = module.AsyncRolloutWorker.stop

    def stop_draining(self) -> None:
        done = threading.Event()

        def drain() -> None:
            while not done.is_set():
                for source in (self.rollout_buffer, self.metrics_queue):
                    try:
                        source.get(timeout=0.05)
                    except (queue.Empty, OSError, ValueError):
                        pass

        drainer = threading.Thread(target=drain, daemon=True, name="agrpo-drain-rollouts")
        drainer.start()
        try:
            stop(self)
        finally:
            done.set()
            drainer.join(timeout=1.0)

    module.AsyncRolloutWorker.stop = stop_draining
    _applied.append("drain_on_stop")


from agrpo.inference.replica_guard import trainer_bearer  # noqa: E402 - next to the patch that uses it


class _BearerRequests:
    """`requests` with an Authorization header on every call (everything else is the real module)."""

    def __init__(self, token: str):
        import requests

        self._requests = requests
        self._header = {"Authorization": f"Bearer {token}"}

    def _call(self, method: str, url: str, **kwargs):
        kwargs["headers"] = {**(kwargs.get("headers") or {}), **self._header}
        return self._requests.request(method, url, **kwargs)

    def get(self, url: str, **kwargs):
        return self._call("GET", url, **kwargs)

    def post(self, url: str, **kwargs):
        return self._call("POST", url, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._requests, name)


def _patch_admin_token(token: str) -> None:
    client = _require("trl.experimental.async_grpo.vllm_client", "requests")
    client.requests = _BearerRequests(token)
    _applied.append("admin_token")


def _patch_rollout_loop() -> None:
    from agrpo.trainer.logs import current_log_file
    from agrpo.trainer.rollout_loop import ROLLOUT_LOG_ENV, AgrpoRolloutLoop

    module = _require("trl.experimental.async_grpo.async_rollout_worker", "_AsyncRolloutLoop")
    current = module.AsyncRolloutWorker._loop_cls
    if not issubclass(current, AgrpoRolloutLoop):  # a loop of agrpo's own that derives from it is kept
        if current is not module._AsyncRolloutLoop:
            raise RuntimeError(
                f"the rollout worker already runs {current.__qualname__}: derive it from "
                "agrpo.trainer.rollout_loop.AgrpoRolloutLoop so that its requests carry the token"
            )
        module.AsyncRolloutWorker._loop_cls = AgrpoRolloutLoop
    log_file = current_log_file()
    if log_file:  # the spawned child reads its environment: it logs where the trainer does
        os.environ[ROLLOUT_LOG_ENV] = log_file
    _applied.append("rollout_loop")


def apply_cpu_workarounds(force: bool = False) -> list[str]:
    """Apply what this machine needs and return the names applied (idempotent). `force` applies all (for tests)."""
    no_gpu = force or not torch.cuda.is_available()
    if no_gpu and "flops" not in _applied:
        _patch_flops()
    if no_gpu and "tree_attention" not in _applied:
        _patch_tree_attention()
    vllm_missing = importlib.util.find_spec("vllm") is None
    if (force or vllm_missing) and "vllm_guard" not in _applied:
        _patch_vllm_guard()
    if "drain_on_stop" not in _applied:
        _patch_drain_on_stop()
    token = trainer_bearer()
    if token and "admin_token" not in _applied:
        _patch_admin_token(token)
    if "rollout_loop" not in _applied:
        _patch_rollout_loop()
    if _applied:
        log.info("CPU workarounds for TRL active: %s", ", ".join(_applied))
    return list(_applied)
