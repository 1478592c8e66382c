"""Every patch agrpo applies to TRL 1.16's AsyncGRPOTrainer, applied in one place before the trainer is built.

Each patch touches one named attribute of TRL and checks that the attribute still exists first (`require`), so a TRL
upgrade that moves it fails loudly (tests/trainer/test_trl_patches.py) instead of silently running unpatched:
- CPU only (agrpo/trainer/cpu_compat.py): FLOPs accounting without CUDA, and the `vllm` package-name guard.
- Attention (agrpo/trainer/attention.py): SDPA packed attention wherever FA3 is not chosen.
- On every machine (here):
  1. Stopping the rollout worker at the end of training took 15 s in every run ("Child did not exit within 15s;
     terminating"): the child had put scored samples on a multiprocessing queue nobody reads any more, and a process
     cannot exit until its queue's feeder thread has flushed them into the pipe. `stop` now drains the queues while
     it waits, so the child exits as soon as its loops end.
  2. agrpo's proxy refuses state changes (adapter loads, pause, resume) without its admin token, which the launcher
     hands to the trainer alone in AGRPO_PROXY_ADMIN_TOKEN; a replica the trainer talks to directly refuses every
     request without its API key (AGRPO_REPLICA_API_KEY, agrpo/inference/replica_guard.py). TRL's VLLMClient calls
     `requests.get/post` directly, so the module it calls through gets a stand-in whose calls carry
     `Authorization: Bearer <token>`.
  3. The rollout worker's loop is agrpo's subclass (agrpo/trainer/rollout_loop.py): the same token on its requests,
     rollouts of a retired adapter version dropped at once instead of retried for minutes, its log in trainer.log.
     This sets the default for every worker; the run's own loop class is chosen in agrpo/trainer/loop_install.py.
"""

from __future__ import annotations

import importlib
import logging

from agrpo.inference.replica_guard import trainer_bearer

log = logging.getLogger(__name__)
_applied: list[str] = []


def require(module_name: str, attribute: str):
    """The module that holds `attribute`, or a RuntimeError saying TRL moved it."""
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise RuntimeError(
            f"agrpo patches `{module_name}.{attribute}` (TRL 1.16). TRL changed underneath: update "
            "agrpo/trainer/trl_patches.py (or cpu_compat.py, attention.py) for the installed version."
        )
    return module


def _patch_drain_on_stop() -> None:
    import queue
    import threading

    module = require("trl.experimental.async_grpo.async_rollout_worker", "AsyncRolloutWorker")
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


def _patch_rollout_loop() -> None:
    from agrpo.trainer.loop_install import install_default_loop

    require("trl.experimental.async_grpo.async_rollout_worker", "_AsyncRolloutLoop")
    install_default_loop()


def _once(name: str, patch, *args) -> None:
    if name not in _applied:
        patch(*args)
        _applied.append(name)


def apply_trl_patches(attention: str = "sdpa", force_cpu: bool = False) -> list[str]:
    """Apply what this machine and the attention choice ("fa3" | "sdpa") need; return every patch applied so far
    (idempotent). `force_cpu` applies the CPU workarounds on any machine (tests)."""
    from agrpo.trainer.attention import use_sdpa_tree_attention
    from agrpo.trainer.cpu_compat import apply_cpu_workarounds

    for name in apply_cpu_workarounds(force=force_cpu):
        if name not in _applied:
            _applied.append(name)
    if attention == "sdpa":
        _once("sdpa_attention", use_sdpa_tree_attention)
    _once("drain_on_stop", _patch_drain_on_stop)
    token = trainer_bearer()
    if token:
        _once("admin_token", _patch_admin_token, token)
    _once("rollout_loop", _patch_rollout_loop)
    log.info("TRL patches active: %s", ", ".join(_applied))
    return list(_applied)
