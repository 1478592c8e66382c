"""Clearing a shared real vLLM server between runs: only the adapters named with the prefix go."""

import pytest
import requests

from agrpo.inference.vllm_server import unload_adapters

pytestmark = pytest.mark.vllm


def served(url: str) -> set[str]:
    return {m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_unloads_the_prefixed_adapters_and_keeps_the_rest(vllm_server, random_adapter_dir):
    names = ["trl-policy-v901", "trl-policy-v902", "kept-adapter"]
    for name in names:
        requests.post(
            f"{vllm_server.url}/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(random_adapter_dir)},
            timeout=120,
        ).raise_for_status()
    try:
        assert sorted(unload_adapters(vllm_server.url)) == ["trl-policy-v901", "trl-policy-v902"]
        assert "kept-adapter" in served(vllm_server.url)
        assert not {n for n in served(vllm_server.url) if n.startswith("trl-policy-")}
    finally:
        assert unload_adapters(vllm_server.url, prefix="kept-") == ["kept-adapter"]
