"""Faults: dead and hung replicas, retries, health, re-admission, runtime membership."""

import asyncio
import json

import aiohttp
from proxy_fakes import FakeReplica, cluster, completion, post


def run(coro):
    return asyncio.run(coro)


async def stats(session, proxy) -> dict:
    async with session.get(proxy.url + "/proxy/stats") as response:
        return await response.json()


async def health(session, proxy) -> int:
    async with session.get(proxy.url + "/health") as response:
        return response.status


async def wait_for(predicate, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_refused_connection_is_retried_once_on_another_replica_and_marked_unhealthy():
    async def scenario():
        async with cluster(2, health_interval_s=30) as (proxy, fakes, session):
            first = await post(session, proxy.url + "/v1/completions", completion([1, 2, 3]))
            home = int(first[1]["X-Agrpo-Replica"])
            await fakes[home].stop()
            status, headers, body = await post(session, proxy.url + "/v1/completions", completion([1, 2, 3]))
            assert status == 200 and int(headers["X-Agrpo-Replica"]) == 1 - home
            s = await stats(session, proxy)
            assert s["retried"] == 1
            assert s["replicas"][home]["healthy"] is False
            assert await health(session, proxy) == 503
            again = await post(session, proxy.url + "/v1/completions", completion([1, 2, 3]))
            assert int(again[1]["X-Agrpo-Replica"]) == 1 - home  # no longer tried first

    run(scenario())


def test_an_error_answer_passes_through_and_never_changes_a_replicas_health():
    """A 500 is the request's problem (on main 7b1b5de three of them took both replicas out and loads got 503):
    it goes back as it is, not retried elsewhere; a 503 ("not now") gets one try on another replica. Only probes
    and connection failures change health."""

    async def scenario():
        async with cluster(2, health_interval_s=30) as (proxy, fakes, session):
            for fake in fakes:
                fake.fail_paths["/v1/completions"] = 500
            results = [await post(session, proxy.url + "/v1/completions", completion([g])) for g in range(6)]
            assert [status for status, _, _ in results] == [500] * 6
            assert all(b"broke" in body for _, _, body in results)
            assert sum(len(f.requests("/v1/completions")) for f in fakes) == 6  # none retried
            s = await stats(session, proxy)
            assert [r["healthy"] for r in s["replicas"]] == [True, True] and s["retried"] == 0
            status, _, _ = await post(
                session,
                proxy.url + "/v1/load_lora_adapter",
                {"lora_name": "v1", "lora_path": "/a", "load_inplace": False},
            )
            assert status == 200 and all(f.loaded == {"v1"} for f in fakes)
            fakes[0].fail_paths["/v1/completions"] = 503
            fakes[1].fail_paths.clear()
            for g in range(4):
                status, headers, _ = await post(session, proxy.url + "/v1/completions", completion([g, 100]))
                assert status == 200 and headers["X-Agrpo-Replica"] == "1"
            s = await stats(session, proxy)
            assert [r["healthy"] for r in s["replicas"]] == [True, True] and s["retried"] >= 1

    run(scenario())


def test_last_replica_error_is_passed_through_when_no_retry_is_possible():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            fakes[0].fail_paths["/v1/completions"] = 503
            status, headers, body = await post(session, proxy.url + "/v1/completions", completion([1]))
            assert status == 503 and headers["X-Agrpo-Replica"] == "0"
            assert b"r0 broke" in body

    run(scenario())


def test_hung_replica_times_out_instead_of_hanging_the_client():
    async def scenario():
        async with cluster(2, total_timeout_s=0.5, health_interval_s=30) as (proxy, fakes, session):
            for fake in fakes:
                fake.completion_delay_s = 3600
            # wait_for bounds a hang (an hour without the timeout); the test asserts what was answered, not when
            status, _, body = await asyncio.wait_for(post(session, proxy.url + "/v1/completions", completion([1])), 60)
            assert status == 502 and "timed out" in json.loads(body)["error"]["message"]
            assert [len(f.requests("/v1/completions")) for f in fakes] == [1, 1]  # one try on each, then 502

    run(scenario())


def test_unhealthy_replica_is_reprobed_resynced_and_readmitted():
    async def scenario():
        async with cluster(2, health_interval_s=0.1) as (proxy, fakes, session):
            load = {"lora_name": "v7", "lora_path": "/a/v7", "load_inplace": False}
            fakes[1].healthy = False
            await wait_for(lambda: not proxy.replicas[1].healthy)
            assert await health(session, proxy) == 503
            # while it is out: the others load an adapter and pause
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", load))[0] == 200
            assert (await post(session, proxy.url + "/pause?mode=keep"))[0] == 200
            assert fakes[1].loaded == set() and not fakes[1].paused
            fakes[1].healthy = True
            await wait_for(lambda: proxy.replicas[1].healthy)
            assert fakes[1].loaded == {"v7"} and fakes[1].paused  # caught up before traffic
            assert await health(session, proxy) == 200

    run(scenario())


def test_degraded_quorum_keeps_health_green():
    async def scenario():
        async with cluster(3, health_quorum=2, health_interval_s=0.1) as (proxy, fakes, session):
            await fakes[0].stop()
            await wait_for(lambda: not proxy.replicas[0].healthy)
            assert await health(session, proxy) == 200
            await fakes[1].stop()
            await wait_for(lambda: not proxy.replicas[1].healthy)
            assert await health(session, proxy) == 503

    run(scenario())


def test_replicas_can_be_added_and_removed_at_runtime():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            load = {"lora_name": "v1", "lora_path": "/a/v1", "load_inplace": False}
            await post(session, proxy.url + "/v1/load_lora_adapter", load)
            extra = FakeReplica(name="extra")
            await extra.start()
            try:
                status, _, body = await post(session, proxy.url + "/proxy/replicas", {"url": extra.url})
                added = json.loads(body)
                assert status == 201 and added["index"] == 1 and added["healthy"] is True
                assert extra.loaded == {"v1"}  # synchronised before it takes traffic
                assert (await post(session, proxy.url + "/proxy/replicas", {"url": extra.url}))[0] == 409
                replicas = {
                    h["X-Agrpo-Replica"]
                    for _, h, _ in await asyncio.gather(
                        *(post(session, proxy.url + "/v1/completions", completion([g] * 20)) for g in range(6))
                    )
                }
                assert replicas == {"0", "1"}
                async with session.delete(proxy.url + "/proxy/replicas", json={"url": fakes[0].url}) as response:
                    assert response.status == 200
                s = await stats(session, proxy)
                assert [r["url"] for r in s["replicas"]] == [extra.url]
                status, headers, _ = await post(session, proxy.url + "/v1/completions", completion([0] * 20))
                assert status == 200 and headers["X-Agrpo-Replica"] == "1"
                async with session.delete(proxy.url + "/proxy/replicas", json={"url": fakes[0].url}) as response:
                    assert response.status == 404
                assert (await post(session, proxy.url + "/proxy/replicas", {"url": "not a url"}))[0] == 400
            finally:
                await extra.stop()

    run(scenario())


def test_a_client_disconnecting_mid_stream_does_not_break_the_proxy():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            fakes[0].stream_chunks, fakes[0].stream_gap_s = 20, 0.05
            async with aiohttp.ClientSession() as other:
                response = await other.post(proxy.url + "/v1/completions", json=completion([1], stream=True))
                await response.content.readany()
                response.close()
            await asyncio.sleep(0.3)
            status, _, _ = await post(session, proxy.url + "/v1/completions", completion([1]))
            assert status == 200
            await wait_for(lambda: proxy.replicas[0].inflight == 0)
            assert proxy.replicas[0].work == 0

    run(scenario())
