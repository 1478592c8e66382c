"""Per-replica adapter availability (`/v1/load_lora_adapter?serve=first`): the answer comes when one replica serves
the adapter, a slower one catches up in the background, and requests naming the adapter go only where it is loaded.
Fake replicas (tests/proxy/proxy_fakes.py) stand in for vLLM: a load's duration and failures are switchable."""

import asyncio
import json
import time

from proxy_fakes import cluster, completion, post

V2 = {"lora_name": "trl-policy-v2", "lora_path": "/adapters/trl-policy-v2", "load_inplace": False}
FIRST = "/v1/load_lora_adapter?serve=first"


def run(coro):
    return asyncio.run(coro)


async def replicas_serving(proxy, session, name):
    async with session.get(proxy.url + "/proxy/stats") as response:
        stats = await response.json()
    return sorted(r["index"] for r in stats["replicas"] if name in r["adapters"])


async def routed_to(proxy, session, prompts, model="trl-policy-v2"):
    replicas = []
    for prompt in prompts:
        status, headers, _ = await post(session, proxy.url + "/v1/completions", completion(prompt, model=model))
        assert status == 200
        replicas.append(int(headers["X-Agrpo-Replica"]))
    return replicas


def test_the_answer_comes_when_one_replica_serves_and_the_slow_one_gets_no_traffic_until_it_does():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            fakes[1].load_delay_s = 1.5
            status, _, body = await post(session, proxy.url + FIRST, V2)
            assert status == 200 and b"served by 1 replica" in body
            assert fakes[0].loaded == {"trl-policy-v2"} and fakes[1].loaded == set()  # answered before it loaded
            assert await replicas_serving(proxy, session, "trl-policy-v2") == [0]
            # distinct prompts are cold: the least-loaded replica would take every other one, but only 0 holds v2
            assert await routed_to(proxy, session, [[i, i + 1, i + 2] for i in range(6)]) == [0] * 6
            deadline = time.monotonic() + 10
            while await replicas_serving(proxy, session, "trl-policy-v2") != [0, 1]:
                assert time.monotonic() < deadline, "the slow replica never caught up"
                await asyncio.sleep(0.05)
            assert fakes[1].loaded == {"trl-policy-v2"}
            # ...and now it takes its share of new prompts for v2
            assert 1 in await routed_to(proxy, session, [[100 + i, 7, 7] for i in range(6)])
            # a model the proxy never loaded (the base model) is not restricted
            assert sorted(set(await routed_to(proxy, session, [[200 + i] for i in range(6)], model="base"))) == [0, 1]

    run(scenario())


def test_a_replica_that_fails_its_load_leaves_rotation_and_is_readmitted_with_the_adapter():
    async def scenario():
        async with cluster(2, health_interval_s=0.2) as (proxy, fakes, session):
            fakes[1].fail_paths["/v1/load_lora_adapter"] = 500
            status, _, _ = await post(session, proxy.url + FIRST, V2)
            assert status == 200
            deadline = time.monotonic() + 5
            while proxy.replicas[1].healthy:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert "could not load adapter trl-policy-v2" in proxy.replicas[1].last_error
            assert await routed_to(proxy, session, [[i, 3] for i in range(4)]) == [0] * 4
            del fakes[1].fail_paths["/v1/load_lora_adapter"]  # the replica recovers: the probe replays v2
            deadline = time.monotonic() + 10
            while not proxy.replicas[1].healthy:
                assert time.monotonic() < deadline, proxy.replicas[1].last_error
                await asyncio.sleep(0.05)
            assert fakes[1].loaded == {"trl-policy-v2"}
            assert await replicas_serving(proxy, session, "trl-policy-v2") == [0, 1]

    run(scenario())


def test_when_no_replica_can_load_it_the_answer_is_the_failure_and_nothing_is_routed_by_it():
    async def scenario():
        async with cluster(2, load_retry_deadline_s=0.3, load_retry_initial_s=0.05) as (proxy, fakes, session):
            fakes[0].fail_paths["/v1/load_lora_adapter"] = 500
            fakes[1].missing_adapter_answers = 10_000  # its mount never shows the files
            status, _, body = await post(session, proxy.url + FIRST, V2)
            message = json.loads(body)["error"]["message"]
            assert status == 500 and "replica 0 answered HTTP 500" in message, message
            assert "trl-policy-v2" not in proxy.replicas.adapters
            assert all(r.healthy for r in proxy.replicas)  # nothing was loaded anywhere: nobody is out of step

    run(scenario())


def test_an_adapter_unloaded_while_a_slow_replica_still_loads_it_is_unloaded_there_too():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            fakes[1].load_delay_s = 0.8
            assert (await post(session, proxy.url + FIRST, V2))[0] == 200
            status, _, _ = await post(session, proxy.url + "/v1/unload_lora_adapter", {"lora_name": "trl-policy-v2"})
            assert status == 200  # sent only to replica 0, the one holding it: no "cannot be found" from replica 1
            assert fakes[1].requests("/v1/unload_lora_adapter") == []
            deadline = time.monotonic() + 5
            while not fakes[1].requests("/v1/unload_lora_adapter"):
                assert time.monotonic() < deadline, "the late load was never undone"
                await asyncio.sleep(0.05)
            assert fakes[0].loaded == fakes[1].loaded == set()
            assert await replicas_serving(proxy, session, "trl-policy-v2") == []

    run(scenario())


def test_an_all_or_nothing_load_records_the_holders_too():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", V2))[0] == 200
            assert await replicas_serving(proxy, session, "trl-policy-v2") == [0, 1]
            assert sorted(set(await routed_to(proxy, session, [[300 + i, 1] for i in range(6)]))) == [0, 1]

    run(scenario())
