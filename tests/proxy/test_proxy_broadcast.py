"""Broadcasts over HTTP: all-or-nothing adapter loads, honest unloads, pause/resume undo."""

import asyncio
import json

from proxy_fakes import cluster, completion, post

LOAD = {"lora_name": "trl-policy-v2", "lora_path": "/adapters/trl-policy-v2", "load_inplace": False}


def run(coro):
    return asyncio.run(coro)


def message(body: bytes) -> str:
    return json.loads(body)["error"]["message"]


def test_load_reaches_every_replica():
    async def scenario():
        async with cluster(3) as (proxy, fakes, session):
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 200 and body.startswith(b"Success")
            assert all(f.loaded == {"trl-policy-v2"} for f in fakes)
            assert all(json.loads(f.requests("/v1/load_lora_adapter")[0][2]) == LOAD for f in fakes)

    run(scenario())


def test_adapter_not_yet_on_a_mount_is_retried_until_it_appears():
    async def scenario():
        async with cluster(2, load_retry_initial_s=0.05) as (proxy, fakes, session):
            fakes[1].missing_adapter_answers = 3
            status, _, _ = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 200
            assert len(fakes[1].requests("/v1/load_lora_adapter")) == 4
            assert all(f.loaded == {"trl-policy-v2"} for f in fakes)

    run(scenario())


def test_adapter_missing_past_the_deadline_is_504_and_rolled_back():
    async def scenario():
        async with cluster(3, load_retry_deadline_s=0.4, load_retry_initial_s=0.05) as (proxy, fakes, session):
            fakes[2].missing_adapter_answers = 10_000
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 504
            text = message(body)
            assert "replica 2" in text and "no adapter" in text
            assert all(f.loaded == set() for f in fakes)  # rolled back on 0 and 1
            assert len(fakes[0].requests("/v1/unload_lora_adapter")) == 1

    run(scenario())


def test_any_other_load_failure_rolls_back_and_reports_its_status():
    async def scenario():
        async with cluster(3) as (proxy, fakes, session):
            fakes[1].fail_paths["/v1/load_lora_adapter"] = 500
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 500
            assert "replica 1" in message(body) and "r1 broke" in message(body)
            assert all(f.loaded == set() for f in fakes)

    run(scenario())


def test_a_repeated_load_is_a_success_and_unloads_nothing():
    """A client that retries a load after its own timeout (the first one went through) must not see a failure, and
    the all-or-nothing rollback must not unload a version the replicas already serve."""

    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 200 and b"already loaded" in body
            assert all(f.loaded == {"trl-policy-v2"} for f in fakes)
            assert all(f.requests("/v1/unload_lora_adapter") == [] for f in fakes)

    run(scenario())


def test_a_replica_that_already_has_the_version_is_left_as_it_was_when_another_fails():
    async def scenario():
        async with cluster(3) as (proxy, fakes, session):
            fakes[0].loaded.add("trl-policy-v2")  # e.g. a replay reached it first
            status, _, _ = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 200 and all(f.loaded == {"trl-policy-v2"} for f in fakes)
            fakes[2].fail_paths["/v1/load_lora_adapter"] = 500
            fakes[1].loaded.clear()
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 500 and "replica 2" in message(body)
            assert fakes[0].loaded == {"trl-policy-v2"}  # had it before the call: not unloaded
            assert fakes[1].loaded == set()  # loaded by this call: rolled back
            assert fakes[0].requests("/v1/unload_lora_adapter") == []

    run(scenario())


def test_hard_failure_stops_the_others_retrying():
    async def scenario():
        async with cluster(2, load_retry_deadline_s=30, load_retry_initial_s=0.05) as (proxy, fakes, session):
            fakes[0].missing_adapter_answers = 10_000
            fakes[1].fail_paths["/v1/load_lora_adapter"] = 400
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 400 and "replica 1" in message(body)
            # stopped by replica 1's refusal, not retried until the 30 s deadline (hundreds of tries at 0.05 s)
            assert len(fakes[0].requests("/v1/load_lora_adapter")) <= 3

    run(scenario())


def test_unload_reports_failures_honestly():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            fakes[1].loaded.clear()  # replica 1 lost it somehow
            status, _, body = await post(session, proxy.url + "/v1/unload_lora_adapter", {"lora_name": "trl-policy-v2"})
            assert status == 404
            assert "replica 1" in message(body) and "unloaded from replica(s) 0" in message(body)
            assert fakes[0].loaded == set()
            status, _, _ = await post(session, proxy.url + "/v1/unload_lora_adapter", {"lora_name": "never-loaded"})
            assert status == 404

    run(scenario())


def test_failed_pause_is_undone_on_the_replicas_that_paused():
    async def scenario():
        async with cluster(3) as (proxy, fakes, session):
            fakes[2].fail_paths["/pause"] = 500
            status, _, body = await post(session, proxy.url + "/pause?mode=keep")
            assert status == 500 and "replica 2" in message(body)
            assert [f.paused for f in fakes] == [False, False, False]
            assert [len(f.requests("/resume")) for f in fakes] == [1, 1, 0]
            assert fakes[0].requests("/pause")[0][1] == "/pause?mode=keep"

    run(scenario())


def test_pause_and_resume_reach_everyone():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            assert (await post(session, proxy.url + "/pause?mode=keep"))[0] == 200
            assert all(f.paused for f in fakes)
            assert (await post(session, proxy.url + "/resume"))[0] == 200
            assert not any(f.paused for f in fakes)
            for path in ("/reset_prefix_cache", "/sleep", "/wake_up"):
                assert (await post(session, proxy.url + path))[0] == 200
                assert all(len(f.requests(path)) == 1 for f in fakes)

    run(scenario())


def test_failed_resume_is_undone_by_pausing_again():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            await post(session, proxy.url + "/pause?mode=keep")
            fakes[0].fail_paths["/resume"] = 503
            status, _, body = await post(session, proxy.url + "/resume")
            assert status == 503 and "replica 0" in message(body)
            assert fakes[1].paused is True
            assert fakes[1].requests("/pause")[-1][1] == "/pause?mode=keep"

    run(scenario())


def test_routing_state_of_unloaded_adapters_is_forgotten_once_a_load_succeeds():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            v1 = dict(LOAD, lora_name="v1")
            await post(session, proxy.url + "/v1/load_lora_adapter", v1)
            for _ in range(2):
                await post(session, proxy.url + "/v1/completions", completion([1, 2], model="v1"))
            assert proxy.router.adapters() == ["v1"]
            await post(session, proxy.url + "/v1/unload_lora_adapter", {"lora_name": "v1"})
            assert proxy.router.adapters() == ["v1"]  # kept until the next load succeeds
            await post(session, proxy.url + "/v1/load_lora_adapter", dict(LOAD, lora_name="v2"))
            assert proxy.router.adapters() == []
            assert proxy.router.tracked == 0

    run(scenario())


def test_bad_load_body_is_400():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            status, _, _ = await post(session, proxy.url + "/v1/load_lora_adapter", data=b"not json")
            assert status == 400
            assert fakes[0].requests("/v1/load_lora_adapter") == []

    run(scenario())


def test_a_replica_that_is_down_does_not_veto_a_state_change():
    """Killed mid-run: it gives no HTTP answer. The others must still pause, load and resume (the trainer's sync
    would otherwise fail and end the run); the dead one is taken out of rotation, and the proxy replays the loaded
    adapters to it before re-admitting it."""

    async def scenario():
        async with cluster(3, health_interval_s=3600) as (proxy, fakes, session):
            port = fakes[1].port
            await fakes[1].stop()
            status, _, body = await post(session, proxy.url + "/pause?mode=keep")
            assert status == 200, body
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 200, body
            status, _, _ = await post(session, proxy.url + "/resume")
            assert status == 200
            assert [f.loaded for f in (fakes[0], fakes[2])] == [{"trl-policy-v2"}] * 2
            assert [f.paused for f in (fakes[0], fakes[2])] == [False, False]
            assert [r.healthy for r in proxy.replicas] == [True, False, True]
            await fakes[1].start(port)  # restarted on its port, empty
            await proxy.control.probe_all()
            assert proxy.replicas.get(1).healthy and fakes[1].loaded == {"trl-policy-v2"}

    run(scenario())


def test_no_replica_answering_is_a_502():
    async def scenario():
        async with cluster(2, health_interval_s=3600) as (proxy, fakes, session):
            for fake in fakes:
                await fake.stop()
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            assert status == 502 and "no replica answered the adapter load" in message(body)

    run(scenario())
