"""A shared fleet under load, through the real proxy (--tenancy) in front of fake replicas (tests/proxy/tenancy_fakes.py):
one tenant's burst against another's fair share, lapsed leases, evicted adapters reloaded. Counts and order are
asserted, not wall-clock times (the waits are bounds on a hang, except the lease bound the contract names)."""

from __future__ import annotations

import asyncio

from proxy_fakes import completion, wait_until
from tenancy_fakes import ADMIN, bearer, call, fleet, load_body, register


def run(coro):
    return asyncio.run(coro)


async def burst_and_steady(proxy, fakes, session):
    """Tenants "burst" and "steady" registered ((tenant, token) each) on replicas that answer after 20 ms."""
    registered = [await register(session, proxy, name) for name in ("burst", "steady")]
    for fake in fakes:
        fake.completion_delay_s = 0.02
    return registered


def test_a_burst_of_50_does_not_delay_the_other_tenant_beyond_its_share(monkeypatch):
    async def scenario():
        # 2 replicas x 1 slot: alone a tenant may hold 2 requests in flight, with two tenants 1 each
        async with fleet(monkeypatch, tenant_slots_per_replica=1) as (proxy, fakes, session):
            (a, token_a), (b, token_b) = await burst_and_steady(proxy, fakes, session)

            async def ask(token, prompt):
                user = a if prompt[0] == 1 else b
                async with session.post(
                    f"{proxy.url}/v1/completions", json=completion(prompt, "base", user=user), headers=bearer(token)
                ) as response:
                    await response.read()
                    return response.status

            burst = [asyncio.create_task(ask(token_a, [1, i])) for i in range(50)]
            await wait_until(lambda: len(proxy.tenancy.fair.waiting.get(a, ())) == 48, what="a's burst queued")
            status, stats = await call(session, "GET", f"{proxy.url}/proxy/stats")
            assert {t["tenant"]: (t["in_flight"], t["waiting"]) for t in stats["tenants"]} == {a: (2, 48), b: (0, 0)}
            steady = [asyncio.create_task(ask(token_b, [2, i])) for i in range(5)]
            statuses = await asyncio.gather(*burst, *steady)
            assert statuses == [200] * 55

            order = [tuple(p) for f in fakes for p in f.arrivals]
            assert sorted(p[1] for p in order if p[0] == 1) == list(range(50))
            assert sorted(p[1] for p in order if p[0] == 2) == list(range(5))
            status, listing = await call(session, "GET", f"{proxy.url}/fleet/tenants", None, ADMIN)
            by_id = {t["tenant"]: t for t in listing["tenants"]}
            assert (by_id[a]["requests"], by_id[b]["requests"]) == (50, 5)
            assert by_id[a]["tokens"] == 350 and by_id[b]["tokens"] == 35
            # a's burst queued at the gate the whole time its last requests could not start: 48 behind 2 slots of
            # 0.02 s answers is at least 0.48 s (what an auto fleet counts as its starvation: fleet/signals.py)
            assert by_id[a]["gate_wait_s"] >= 0.4 and by_id[a]["gate_wait_s"] > by_id[b]["gate_wait_s"]
            assert proxy.tenancy.fair.in_flight == {} and proxy.tenancy.fair.waiting == {}
            # over both replicas: a never held more than the fleet's 2 slots, b never more than its 1 of 2
            assert fakes[0].peak is fakes[1].peak
            assert fakes[0].peak[a] == 2 and fakes[0].peak[b] == 1

    run(scenario())


def test_the_steady_tenant_finishes_while_the_burst_is_still_queued(monkeypatch):
    """Ordering, not time: every one of b's 5 requests reaches a replica while most of a's 50 still wait."""

    async def scenario():
        async with fleet(monkeypatch, tenant_slots_per_replica=1) as (proxy, fakes, session):
            (a, token_a), (b, token_b) = await burst_and_steady(proxy, fakes, session)
            seen: list[str] = []

            async def ask(token, who, i):
                async with session.post(
                    f"{proxy.url}/v1/completions", json=completion([ord(who), i], "base"), headers=bearer(token)
                ) as response:
                    await response.read()
                    seen.append(who)
                    return response.status

            burst = [asyncio.create_task(ask(token_a, "a", i)) for i in range(50)]
            await wait_until(lambda: len(proxy.tenancy.fair.waiting.get(a, ())) == 48, what="a's burst queued")
            steady = [asyncio.create_task(ask(token_b, "b", i)) for i in range(5)]
            assert await asyncio.gather(*steady) == [200] * 5
            a_done_when_b_done = seen.count("a")
            # b holds 1 of the 2 slots: while its 5 ran one after another, a got about as many answers (its 2
            # already in flight, then 1 at a time), nowhere near its 50
            assert a_done_when_b_done <= 5 + 2 + 3, seen
            assert len(proxy.tenancy.fair.waiting.get(a, ())) >= 50 - 10 - 2 - 3
            assert await asyncio.gather(*burst) == [200] * 50

    run(scenario())


def test_a_lapsed_lease_unloads_the_adapters_on_every_replica_within_lease_plus_1s(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch, n=3) as (proxy, fakes, session):
            loop = asyncio.get_running_loop()
            registered = loop.time()  # its lease runs from here (the loads below take a while on a busy machine)
            gone, token_gone = await register(session, proxy, "dies", lease_s=1.0)
            kept, token_kept = await register(session, proxy, "lives", lease_s=1.0)

            async def renew():
                while True:
                    await call(session, "POST", f"{proxy.url}/fleet/tenants/{kept}/lease", None, token_kept)
                    await asyncio.sleep(0.25)

            renewing = asyncio.create_task(renew())  # from its registration on, as the trainer's thread does
            for tenant, token in ((gone, token_gone), (kept, token_kept)):
                for version in (1, 2):
                    loaded = await call(
                        session, "POST", f"{proxy.url}/v1/load_lora_adapter", load_body(tenant, version), token
                    )
                    assert loaded[0] == 200
            assert all(len(f.loaded) == 4 for f in fakes)
            try:
                # the contract's bound (docs/proxy.md): lease_s + 1 s tick + the unload (instant on fakes)
                await wait_until(
                    lambda: not any(n.startswith(f"{gone}/") for f in fakes for n in f.loaded),
                    timeout=1.0 + 1.0 + 0.5,
                    what="the lapsed tenant's adapters unloaded everywhere",
                )
                assert loop.time() - registered >= 0.9  # not before its lease lapsed
                await asyncio.sleep(1.5)  # the renewed tenant outlives more than one lease
            finally:
                renewing.cancel()
            for fake in fakes:
                assert fake.loaded == {f"{kept}/trl-policy-v1", f"{kept}/trl-policy-v2"}
                assert sorted(b[2] for b in fake.requests("/v1/unload_lora_adapter")) == sorted(
                    f'{{"lora_name": "{gone}/trl-policy-v{v}"}}'.encode() for v in (1, 2)
                )
            assert gone not in proxy.tenancy.registry.tenants and kept in proxy.tenancy.registry.tenants
            status, _ = await call(session, "POST", f"{proxy.url}/fleet/tenants/{gone}/lease", None, token_gone)
            assert status == 404

    run(scenario())


def test_an_evicted_adapter_is_reloaded_and_the_request_retried(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch, n=1) as (proxy, fakes, session):
            fake = fakes[0]
            fake.check_models = True  # 404 "The model `x` does not exist." for an adapter it does not hold
            a, token_a = await register(session, proxy, "run-a")
            name = f"{a}/trl-policy-v1"
            assert (await call(session, "POST", f"{proxy.url}/v1/load_lora_adapter", load_body(a), token_a))[0] == 200
            fake.loaded.discard(name)  # vLLM lost it (evicted, or the replica restarted behind the proxy's back)
            for stream in (False, True):
                status, body = await call(
                    session, "POST", f"{proxy.url}/v1/completions", completion([1], name, stream=stream), token_a
                )
                assert status == 200, body
                fake.loaded.discard(name)
            assert len(fake.requests("/v1/load_lora_adapter")) == 3  # the load, then one reload per request
            assert len(fake.requests("/v1/completions")) == 4  # each: the 404, then the retry
            # an adapter the proxy never loaded stays vLLM's 404 (nothing to reload)
            status, body = await call(
                session, "POST", f"{proxy.url}/v1/completions", completion([1], f"{a}/trl-policy-v9"), token_a
            )
            assert status == 404 and "does not exist" in body["error"]["message"]
            assert len(fake.requests("/v1/load_lora_adapter")) == 3

    run(scenario())


def test_waiting_requests_of_a_tenant_that_leaves_get_410_and_a_client_that_leaves_frees_its_place(monkeypatch):
    async def scenario():
        async with fleet(monkeypatch, n=1, tenant_slots_per_replica=1) as (proxy, fakes, session):
            a, token_a = await register(session, proxy, "run-a")
            fakes[0].completion_delay_s = 0.5

            async def ask(i):
                return await call(session, "POST", f"{proxy.url}/v1/completions", completion([i], "base"), token_a)

            first = asyncio.create_task(ask(0))
            waiting = [asyncio.create_task(ask(i)) for i in (1, 2, 3)]
            await wait_until(lambda: len(proxy.tenancy.fair.waiting.get(a, ())) == 3, what="3 waiting")
            waiting[0].cancel()  # the client of the oldest waiting request leaves
            await wait_until(lambda: len(proxy.tenancy.fair.waiting.get(a, ())) == 2, what="its place freed")
            status, _ = await call(session, "DELETE", f"{proxy.url}/fleet/tenants/{a}", None, token_a)
            assert status == 200
            for task in waiting[1:]:
                status, body = await task
                assert status == 410 and "register again" in body["error"]["message"]
            assert (await first)[0] == 200
            assert len(fakes[0].requests("/v1/completions")) == 1

    run(scenario())


def test_a_reload_that_races_the_runs_unload_is_undone(monkeypatch):
    """The run unloads a version while the proxy reloads it on a replica that lost it: the reload must not leave the
    retired version holding a LoRA slot there."""

    async def scenario():
        async with fleet(monkeypatch, n=1) as (proxy, fakes, session):
            fake = fakes[0]
            fake.check_models = True
            a, token_a = await register(session, proxy, "run-a")
            name = f"{a}/trl-policy-v1"
            assert (await call(session, "POST", f"{proxy.url}/v1/load_lora_adapter", load_body(a), token_a))[0] == 200
            fake.loaded.discard(name)
            fake.load_delay_s = 0.5  # the reload is slow: the unload below lands while it runs
            asking = asyncio.create_task(
                call(session, "POST", f"{proxy.url}/v1/completions", completion([1], name), token_a)
            )
            await wait_until(lambda: len(fake.requests("/v1/load_lora_adapter")) == 2, what="the reload under way")
            unload = {"lora_name": name}
            await call(session, "POST", f"{proxy.url}/v1/unload_lora_adapter", unload, token_a)
            status, _ = await asking
            assert status == 404  # vLLM's answer stands: the version is gone
            assert name not in fake.loaded
            assert len(fake.requests("/v1/completions")) == 1  # not retried

    run(scenario())


def test_a_load_that_lands_after_its_tenant_left_is_unloaded(monkeypatch):
    """The run's last load is still running when its lease lapses (it died mid-sync): the adapter it leaves behind
    belongs to nobody and is unloaded by the next tick, on every replica."""

    async def scenario():
        async with fleet(monkeypatch) as (proxy, fakes, session):
            a, token_a = await register(session, proxy, "dies-mid-load", lease_s=1.0)
            for fake in fakes:
                fake.load_delay_s = 2.3  # longer than the lease and the tick that lets it go (1 s + 1 s)
            status, _ = await call(session, "POST", f"{proxy.url}/v1/load_lora_adapter", load_body(a), token_a)
            assert status == 200  # the load was admitted while the tenant lived
            assert a not in proxy.tenancy.registry.tenants  # and its lease lapsed before the load answered
            await wait_until(
                lambda: not any(f.loaded for f in fakes), timeout=1.0 + 0.5, what="the orphan unloaded at the next tick"
            )
            assert all(len(f.requests("/v1/unload_lora_adapter")) == 1 for f in fakes)
            assert proxy.control.loaded == {}

    run(scenario())
