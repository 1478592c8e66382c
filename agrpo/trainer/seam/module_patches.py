"""The functions of TRL's modules that agrpo replaces, because TRL calls them by module name and offers no argument,
class attribute or method to override instead. Everything else agrpo changes in TRL is an override of agrpo's
subclasses (agrpo/trainer/seam/: trainer.py, client.py) or goes through TRL's public hooks (the rollout worker).

Each replacement touches one named attribute, taken through `require` (agrpo/trl_compat.py): every private name of
TRL agrpo relies on is listed there and checked when the run is prepared, so a TRL upgrade that moves one stops the
run before anything starts instead of silently running unpatched.

For the whole process, before the trainer is built (`apply_trl_patches`):
- CPU only (cpu_compat.py here): FLOPs accounting without CUDA.
- Attention: SDPA packed attention (agrpo/trainer/seam/attention.py) wherever FA3 is not chosen.
- The admin token: agrpo's proxy refuses state changes (adapter loads, pause, resume) without its admin token, which
  the launcher hands to the trainer alone in AGRPO_PROXY_ADMIN_TOKEN; a replica the trainer talks to directly refuses
  every request without its API key (AGRPO_REPLICA_API_KEY, agrpo/inference/replica_guard.py). TRL's VLLMClient calls
  `requests.get/post` of its module directly, so that module gets a stand-in whose calls carry
  `Authorization: Bearer <token>`. (The rollout child's requests carry it from agrpo's loop: rollout/client.py.)
For a span (context managers, restored after):
- `fix_loaded_model`: TRL's trainer loads its model through its module's `create_model_from_path`, then wraps it in
  PEFT at once; the FSDP untie of tied embeddings (seam/fsdp_compat.py) must come in between.
- `retaining_shutil`: TRL's blocking LoRA sync deletes an old version's folder with its module's `shutil.rmtree`;
  the retention policy (sync/retention.py) defers that deletion.
- `building_client`: TRL's trainer builds its `VLLMClient` by its module's name inside `__init__`, with no argument
  to pass one; for that span the name is agrpo's subclass (seam/client.py), so TRL's is never built and replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from agrpo.inference.replica_guard import trainer_bearer
from agrpo.trl_compat import require

log = logging.getLogger(__name__)
_applied: list[str] = []
TRAINER_MODULE = "trl.experimental.async_grpo.async_grpo_trainer"


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
    client = require("trl.experimental.async_grpo.vllm_client", "requests")
    client.requests = _BearerRequests(token)


def use_sdpa_tree_attention() -> None:
    """TRL's tree attention calls `packing._flash_attn().flash_attn_varlen_func`: serve it agrpo's SDPA version
    (agrpo/trainer/seam/attention.py) instead."""
    from agrpo.trainer.seam.attention import varlen_causal_attention

    packing = require("trl.experimental.async_grpo.packing", "_flash_attn")
    kernel = SimpleNamespace(flash_attn_varlen_func=varlen_causal_attention)
    packing._flash_attn = lambda: kernel


def _once(name: str, patch, *args) -> None:
    if name not in _applied:
        patch(*args)
        _applied.append(name)


def apply_trl_patches(attention: str = "sdpa", force_cpu: bool = False) -> list[str]:
    """Apply what this machine and the attention choice ("fa3" | "sdpa") need; return every patch applied so far
    (idempotent). `force_cpu` applies the CPU workarounds on any machine (tests)."""
    from agrpo.trainer.seam.cpu_compat import apply_cpu_workarounds

    for name in apply_cpu_workarounds(force=force_cpu):
        if name not in _applied:
            _applied.append(name)
    if attention == "sdpa":
        _once("sdpa_attention", use_sdpa_tree_attention)
    token = trainer_bearer()
    if token:
        _once("admin_token", _patch_admin_token, token)
    log.info("TRL patches active: %s", ", ".join(_applied))
    return list(_applied)


@contextlib.contextmanager
def fix_loaded_model(fix: Callable[[Any], Any] | None) -> Iterator[None]:
    """Apply `fix(model)` to the model AsyncGRPOTrainer loads from its path, right after from_pretrained and before
    PEFT and FSDP wrap it (TRL takes a path, not a model, so this is the only place to reach it). None: nothing."""
    if fix is None:
        yield
        return
    module = require(TRAINER_MODULE, "create_model_from_path")
    load = module.create_model_from_path

    def load_and_fix(*args: Any, **kwargs: Any) -> Any:
        model = load(*args, **kwargs)
        fix(model)
        return model

    module.create_model_from_path = load_and_fix
    try:
        yield
    finally:
        module.create_model_from_path = load


class RetainingShutil:
    """Stands in for the `shutil` module inside TRL's trainer module: `rmtree` of a published adapter version goes
    through the retention policy (`request_delete`), everything else is the real shutil."""

    def __init__(self, retention: Any):
        self._retention = retention

    def rmtree(self, path: Any, *args: Any, **kwargs: Any) -> None:
        if not self._retention.request_delete(os.fspath(path)):
            shutil.rmtree(path, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(shutil, name)


@contextlib.contextmanager
def retaining_shutil(retention: Any) -> Iterator[RetainingShutil]:
    """TRL's trainer module deletes through `RetainingShutil(retention)` for the span; restored after."""
    module = require(TRAINER_MODULE, "shutil")
    stand_in = RetainingShutil(retention)
    module.shutil = stand_in
    try:
        yield stand_in
    finally:
        module.shutil = shutil


@contextlib.contextmanager
def building_client(client_cls: type) -> Iterator[None]:
    """TRL's trainer module builds `client_cls` where it builds its `VLLMClient`, for the span; restored after."""
    module = require(TRAINER_MODULE, "VLLMClient")
    trl_cls = module.VLLMClient
    module.VLLMClient = client_cls
    try:
        yield
    finally:
        module.VLLMClient = trl_cls
