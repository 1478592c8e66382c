"""The shared fleet's routes and namespace rules through the real proxy (--tenancy) in front of fake replicas
(tests/proxy/tenancy_fakes.py: fakes stand in for vLLM, the proxy's answers are what is tested)."""

from __future__ import annotations

import asyncio

import pytest
from proxy_fakes import FakeReplica, completion
from tenancy_fakes import ADMIN, call, error, fleet, load_body, register

from agrpo.proxy import ProxyServer, ProxySettings


def run(coro):
    return asyncio.run(coro)


def test_registration_is_the_admins_and_says_when_the_fleet_is_full(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch, max_tenants=2, max_loras=6, max_lora_rank=16) as (proxy, fakes, session):
            url = f"{proxy.url}/fleet/tenants"
            body = {"run": "gsm8k r=8", "lease_s": 20, "versions": 3, "lora_rank": 8}
            assert (await call(session, "POST", url, body))[0] == 401
            status, first = await call(session, "POST", url, body, ADMIN)
            assert status == 200
            assert first["tenant"] == "t1-gsm8k-r-8" and first["prefix"] == "t1-gsm8k-r-8/"
            assert first["lease_s"] == 20.0 and len(first["token"]) >= 43
            status, answer = await call(session, "POST", url, body, first["token"])  # a tenant cannot register
            assert status == 403 and "never paused by one run" in error(answer)
            status, answer = await call(session, "POST", url, {**body, "versions": 4}, ADMIN)
            assert status == 409 and "6 LoRA slots (--max-loras)" in error(answer)
            status, answer = await call(session, "POST", url, {**body, "lora_rank": 32}, ADMIN)
            assert status == 409 and "max_lora_rank 16" in error(answer)
            for bad in ({"run": ""}, {"run": "x", "lease_s": -1}, {"run": "x", "versions": "2"}, [1]):
                status, answer = await call(session, "POST", url, bad, ADMIN)
                assert status == 400 and "POST /fleet/tenants" in error(answer), bad
            assert (await call(session, "POST", url, body, ADMIN))[0] == 200
            status, answer = await call(session, "POST", url, {**body, "versions": 0 + 1}, ADMIN)
            assert status == 409 and "inference.shared.max_tenants=N" in error(answer)

    run(scenario())


def test_tenancy_needs_the_admin_token():
    problems = ProxySettings(upstreams=["http://127.0.0.1:1"], tenancy=True).problems()
    assert any("--tenancy needs --admin-token-env" in p for p in problems)


def test_tenant_b_cannot_touch_tenant_as_adapters_nor_pause_the_fleet(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch) as (proxy, fakes, session):
            a, token_a = await register(session, proxy, "run-a")
            b, token_b = await register(session, proxy, "run-b")
            base = proxy.url
            assert (await call(session, "POST", f"{base}/v1/load_lora_adapter", load_body(a), token_a))[0] == 200
            assert all(f"{a}/trl-policy-v1" in f.loaded for f in fakes)
            loads_before = sum(len(f.requests("/v1/load_lora_adapter")) for f in fakes)

            status, answer = await call(session, "POST", f"{base}/v1/load_lora_adapter", load_body(a, 2), token_b)
            assert status == 403 and f"tenant {b} may load only adapters named '{b}/...'" in error(answer)
            body = {"lora_name": f"{a}/trl-policy-v1"}
            status, answer = await call(session, "POST", f"{base}/v1/unload_lora_adapter", body, token_b)
            assert status == 403 and f"may unload only adapters named '{b}/...'" in error(answer)
            status, answer = await call(session, "POST", f"{base}/v1/load_lora_adapter", {"lora_name": "x"}, token_b)
            assert status == 403
            for path in ("/pause?mode=keep", "/resume", "/reset_prefix_cache", "/sleep", "/wake_up"):
                status, answer = await call(session, "POST", f"{base}{path}", None, token_b)
                assert status == 403 and "use sync.mode=background" in error(answer), path
            extra = FakeReplica(name="extra")
            await extra.start()
            for method in ("POST", "DELETE"):
                status, answer = await call(session, method, f"{base}/proxy/replicas", {"url": extra.url}, token_b)
                assert status == 403, method
            await extra.stop()
            status, answer = await call(session, "POST", f"{base}/collective_rpc", {"m": 1}, token_b)
            assert status == 403
            assert not any(f.paused for f in fakes)
            assert all(f"{a}/trl-policy-v1" in f.loaded for f in fakes)
            assert sum(len(f.requests("/v1/load_lora_adapter")) for f in fakes) == loads_before
            assert not any(f.requests("/v1/unload_lora_adapter") for f in fakes)

            status, answer = await call(
                session, "POST", f"{base}/v1/completions", completion([1, 2], f"{a}/trl-policy-v1"), token_b
            )
            assert status == 403 and f"not '{a}/trl-policy-v1'" in error(answer)
            status, answer = await call(
                session, "POST", f"{base}/v1/completions", completion([1, 2], f"{a}/trl-policy-v1")
            )
            assert status == 401 and "tenant token" in error(answer)
            assert not any(f.requests("/v1/completions") for f in fakes)

            ok = await call(
                session, "POST", f"{base}/v1/completions", completion([1, 2], f"{a}/trl-policy-v1"), token_a
            )
            assert ok[0] == 200 and ok[1]["model"] == f"{a}/trl-policy-v1"
            assert (await call(session, "POST", f"{base}/v1/completions", completion([3], "base"), token_b))[0] == 200
            admin = await call(session, "POST", f"{base}/v1/completions", completion([4], f"{a}/trl-policy-v1"), ADMIN)
            assert admin[0] == 200  # the admin keeps every right
            status, _ = await call(session, "GET", f"{base}/server_info", None, token_b)  # a tenant may read
            assert status == 200
            assert (await call(session, "POST", f"{base}/pause?mode=keep", None, ADMIN))[0] == 200
            assert (await call(session, "POST", f"{base}/resume", None, ADMIN))[0] == 200

    run(scenario())


def test_lease_show_list_and_unregister(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch) as (proxy, fakes, session):
            a, token_a = await register(session, proxy, "run-a", lease_s=30)
            b, token_b = await register(session, proxy, "run-b")
            base = f"{proxy.url}/fleet/tenants"
            for version in (1, 2):
                loaded = await call(
                    session, "POST", f"{proxy.url}/v1/load_lora_adapter", load_body(a, version), token_a
                )
                assert loaded[0] == 200
            status, lease = await call(session, "POST", f"{base}/{a}/lease", None, token_a)
            assert status == 200 and lease == {"expires_in_s": 30.0}
            assert (await call(session, "POST", f"{base}/{a}/lease", None, token_b))[0] == 403
            assert (await call(session, "POST", f"{base}/{a}/lease"))[0] == 401
            assert (await call(session, "POST", f"{base}/{a}/lease", None, ADMIN))[0] == 200

            answer = await call(
                session, "POST", f"{proxy.url}/v1/completions", completion([5, 6], f"{a}/trl-policy-v2"), token_a
            )
            assert answer[0] == 200
            status, mine = await call(session, "GET", f"{base}/{a}", None, token_a)
            assert status == 200
            assert mine["adapters"] == [f"{a}/trl-policy-v1", f"{a}/trl-policy-v2"]
            assert (mine["requests"], mine["tokens"], mine["in_flight"], mine["run"]) == (1, 7, 0, "run-a")
            assert {"replica_seconds", "lease_expires_in_s"} <= set(mine)  # the run's own replica-seconds
            assert {"replica_seconds", "replicas", "idle_replica_seconds"} <= set(mine["fleet"])  # the fleet's totals
            assert (await call(session, "GET", f"{base}/{a}", None, token_b))[0] == 403
            assert (await call(session, "GET", base, None, token_a))[0] == 403
            status, listing = await call(session, "GET", base, None, ADMIN)
            assert status == 200 and [t["tenant"] for t in listing["tenants"]] == [a, b]
            assert listing["replicas"] == 2

            status, gone = await call(session, "DELETE", f"{base}/{a}", None, token_a)
            assert status == 200 and gone == {"unloaded": [f"{a}/trl-policy-v1", f"{a}/trl-policy-v2"]}
            assert not any(name.startswith(f"{a}/") for f in fakes for name in f.loaded)
            status, answer = await call(session, "POST", f"{base}/{a}/lease", None, token_a)
            assert status == 404 and "register again" in error(answer)
            assert (await call(session, "POST", f"{proxy.url}/v1/completions", completion([1], "base"), token_a))[
                0
            ] == 401
            stats = await call(session, "GET", f"{proxy.url}/proxy/stats")
            assert stats[0] == 200 and "routed" in stats[1] and [t["tenant"] for t in stats[1]["tenants"]] == [b]

    run(scenario())


def test_without_tenancy_nothing_changes(monkeypatch):
    async def scenario():
        fake = FakeReplica(name="r0")
        await fake.start()
        proxy = ProxyServer(ProxySettings(upstreams=[fake.url], port=0))
        await proxy.start()
        try:
            assert proxy.tenancy is None and proxy.routed.tenancy is None
            import aiohttp

            async with aiohttp.ClientSession() as session:
                status, _ = await call(session, "POST", f"{proxy.url}/v1/completions", completion([1], "anything"))
                assert status == 200
                status, stats = await call(session, "GET", f"{proxy.url}/proxy/stats")
                assert "tenants" not in stats
                status, _ = await call(session, "GET", f"{proxy.url}/fleet/tenants")
                assert status == 404  # not a route: the replica's own 404
        finally:
            await proxy.stop()
            await fake.stop()

    run(scenario())


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_are_counted_and_replica_seconds_attributed(monkeypatch, stream):
    async def scenario():
        async with fleet(monkeypatch) as (proxy, fakes, session):
            a, token_a = await register(session, proxy, "run-a")
            b, _ = await register(session, proxy, "run-b")
            for i in range(3):
                payload = completion([i, 1, 2], "base", stream=stream)
                async with session.post(
                    f"{proxy.url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {token_a}"}
                ) as r:
                    assert r.status == 200
                    await r.read()
            tenancy = proxy.tenancy
            tenancy._last_tick -= 2.0  # two seconds since the last tick, as the loop would see them
            await tenancy.tick()
            status, listing = await call(session, "GET", f"{proxy.url}/fleet/tenants", None, ADMIN)
            by_id = {t["tenant"]: t for t in listing["tenants"]}
            assert by_id[a]["tokens"] == (9 if stream else 21)  # 3 events per stream, or usage 7 per answer
            assert by_id[b]["tokens"] == 0 and by_id[b]["replica_seconds"] == 0
            assert by_id[a]["replica_seconds"] >= 4.0  # 2 replicas x 2 s went to the only tenant with tokens
            total = listing["replica_seconds"]
            assert abs(total - by_id[a]["replica_seconds"] - listing["idle_replica_seconds"]) < 1e-6

    run(scenario())


def test_a_runs_token_draws_on_the_trusted_body_share(monkeypatch):
    """The runs of a shared fleet all come from one address: their bodies must not count as strangers' (trust.py)."""

    async def scenario():
        async with fleet(monkeypatch) as (proxy, fakes, session):
            _, token = await register(session, proxy, "run-a")
            assert proxy.trusted(f"Bearer {token}") and proxy.trusted(f"Bearer {ADMIN}")
            assert not proxy.trusted(f"Bearer {token}x") and not proxy.trusted(None)

    run(scenario())
