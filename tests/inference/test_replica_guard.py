"""The replicas' API key guard (agrpo/inference/replica_guard.py) as vLLM runs it: an ASGI middleware in front of
an app. The real vLLM server with the key: tests/proxy/test_proxy_vllm.py."""

import asyncio
import hashlib

import pytest

from agrpo.inference.replica_guard import ReplicaGuard, allowed, trainer_bearer

KEY = hashlib.sha256(b"k3y").digest()


@pytest.mark.parametrize(
    "method,path,authorization,expected",
    [
        ("GET", "/health", None, True),
        ("GET", "/metrics/", None, True),
        ("OPTIONS", "/v1/completions", None, True),
        ("POST", "/health", None, False),  # only reads are open
        ("POST", "/pause", None, False),
        ("POST", "/collective_rpc", "Bearer wrong", False),
        ("POST", "/v1/load_lora_adapter", "Basic k3y", False),
        ("POST", "/v1/load_lora_adapter", "k3y", False),
        ("POST", "/reset_prefix_cache", "Bearer k3y", True),
        ("GET", "/server_info", "bearer k3y ", True),
        ("GET", "/v1/models", None, False),
    ],
)
def test_only_reads_of_health_and_metrics_go_without_the_key(method, path, authorization, expected):
    assert allowed(method, path, authorization, KEY) is expected


def call(guard, method, path, headers=()):
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(guard({"type": "http", "method": method, "path": path, "headers": list(headers)}, None, send))
    return sent


def test_the_middleware_answers_401_before_the_app(monkeypatch):
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    monkeypatch.setenv("VLLM_API_KEY", "k3y")
    guard = ReplicaGuard(app)
    sent = call(guard, "POST", "/pause")
    assert sent[0]["status"] == 401 and b"API key" in sent[1]["body"] and reached == []
    assert call(guard, "POST", "/pause", [(b"authorization", b"Bearer k3y")]) == [] and reached == ["/pause"]
    monkeypatch.setenv("VLLM_API_KEY", " ")
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        ReplicaGuard(app)  # a replica told to guard itself without a key does not start open


def test_the_trainer_sends_the_proxy_token_or_else_the_replica_key():
    assert trainer_bearer({"AGRPO_PROXY_ADMIN_TOKEN": "a", "AGRPO_REPLICA_API_KEY": "r"}) == "a"
    assert trainer_bearer({"AGRPO_REPLICA_API_KEY": "r"}) == "r"
    assert trainer_bearer({}) is None
