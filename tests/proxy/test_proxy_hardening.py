"""Hostile or broken input and broken replicas: 400s not 500s, bounded memory, honest streams,
a hung replica that never holds the control lock. Fake replicas stand in for vLLM."""

import asyncio
import json

import aiohttp
import pytest
from proxy_fakes import cluster, completion, post

from agrpo.proxy.metrics import Metrics, label
from agrpo.proxy.replicas import ReplicaSet

LOAD = {"lora_name": "trl-policy-v1", "lora_path": "/a/v1", "load_inplace": False}


def run(coro):
    return asyncio.run(coro)


def message(body: bytes) -> str:
    return json.loads(body)["error"]["message"]


async def wait_for(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (b'{"model": "m", "prompt": [1], "n": ' + b"9" * 400 + b"}", "'n' must be between"),
        (b'{"model": "m", "prompt": [1], "n": 0}', "'n' must be between"),
        (b'{"model": "m", "prompt": [1], "n": -3}', "'n' must be between"),
        (b'{"model": "m", "prompt": [1], "max_tokens": ' + b"9" * 400 + b"}", "'max_tokens' must"),
        (b'{"model": "m", "prompt": [1], "max_tokens": -1}', "'max_tokens' must"),
        (b'{"model": "m", "prompt": "x", "max_completion_tokens": 99999999999999}', "'max_completion_tokens'"),
        (b'{"model": "m", "prompt": [1], "n": 1e9}', "'n' must be a JSON integer"),
        (b'{"model": "m", "prompt": [1], "n": "1000000000"}', "'n' must be a JSON integer"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 3e9}', "'max_tokens' must be a JSON integer"),
        (b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "prompt": [1]}', "nested"),
        (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
    ],
)
def test_out_of_range_numbers_and_absurd_nesting_are_400_with_a_message(raw, expected):
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            status, _, body = await post(
                session, proxy.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}
            )
            assert status == 400 and expected in message(body)
            assert fakes[0].requests("/v1/completions") == []

    run(scenario())


def test_absolute_form_request_line_is_400_and_reaches_no_replica():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            host, port = proxy.url[len("http://") :].rsplit(":", 1)
            body = json.dumps(completion([1, 2])).encode()
            for target in (
                b"http://evil.example/v1/completions",
                b"http://evil.example/pause",
                b"http://evil.example/v1/models",
            ):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(
                    b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body
                )
                answer = await reader.read()
                writer.close()
                assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
                assert b"must be a path" in answer
            assert {s[1] for s in fakes[0].seen} <= {"/health"}

    run(scenario())


def test_label_values_cannot_inject_series_into_metrics():
    assert label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    replicas = ReplicaSet([])
    replicas.add('http://h:1"} 1\nagrpo_fake_series{x="1')  # never admitted by url_problems
    text = Metrics().prometheus(replicas, 0)
    assert not any(line.startswith("agrpo_fake_series") for line in text.splitlines())
    assert all(line.startswith(("#", "agrpo_proxy_")) for line in text.splitlines() if line)


def test_concurrent_large_bodies_stay_within_the_in_flight_budget():
    cap = 5 * 1024 * 1024
    big = completion([12345] * 350_000)  # ~2.1 MB of JSON each

    async def scenario():
        async with cluster(1, max_inflight_body_bytes=cap, max_body_bytes=4 * 1024 * 1024) as (proxy, fakes, session):
            fakes[0].completion_delay_s = 1.5  # keep the admitted ones in flight
            results = await asyncio.gather(*(post(session, proxy.url + "/v1/completions", big) for _ in range(8)))
            statuses = sorted(status for status, _, _ in results)
            async with session.get(proxy.url + "/proxy/stats") as response:
                stats = await response.json()
            assert 2.0e6 < stats["body_bytes_peak"] <= cap
            assert stats["body_bytes_held"] == 0
            assert statuses.count(200) >= 2 and 503 in statuses
            assert stats["body_budget_refused"] == statuses.count(503)
            refused = [body for status, _, body in results if status == 503]
            assert "--max-inflight-body-bytes" in message(refused[0])

            # chunked uploads (no Content-Length) are counted as they arrive, too
            async def chunks():
                raw = json.dumps(big).encode()
                for i in range(0, len(raw), 65536):
                    yield raw[i : i + 65536]

            fakes[0].completion_delay_s = 0
            async with session.post(proxy.url + "/v1/completions", data=chunks()) as response:
                assert response.status == 200
            async with session.get(proxy.url + "/proxy/stats") as response:
                assert (await response.json())["body_bytes_held"] == 0

    run(scenario())


@pytest.mark.parametrize("end", ["cut", "no-done"])
def test_a_stream_cut_by_the_replica_reaches_the_client_as_an_error(end):
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            fakes[0].stream_end, fakes[0].stream_gap_s = end, 0.01
            received = b""
            with pytest.raises(aiohttp.ClientPayloadError):
                async with session.post(
                    proxy.url + "/v1/completions", json=completion([1, 2], stream=True)
                ) as response:
                    assert response.status == 200
                    async for chunk in response.content.iter_any():
                        received += chunk
            assert received.count(b"data: {") == 4  # 3 events from the replica + the error
            assert b"event: error" in received and b"data: [DONE]" not in received
            assert "cut short" in received.decode()
            async with session.get(proxy.url + "/proxy/stats") as r:
                assert (await r.json())["stream_cuts"] == 1
            fakes[0].stream_end = "done"  # the proxy itself is fine afterwards
            async with session.post(proxy.url + "/v1/completions", json=completion([1, 2], stream=True)) as response:
                assert (await response.read()).endswith(b"data: [DONE]\n\n")

    run(scenario())


def test_a_replica_hanging_on_readmission_never_holds_the_control_lock():
    async def scenario():
        async with cluster(2, health_interval_s=0.05, admit_timeout_s=60) as (proxy, fakes, session):
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200
            fakes[1].healthy = False
            await wait_for(lambda: not proxy.replicas[1].healthy)
            fakes[1].hang_paths.add("/v1/load_lora_adapter")  # answers /health, hangs on loads
            fakes[1].healthy = True
            await wait_for(lambda: proxy.replicas[1].admitting)
            status, _, _ = await post(session, proxy.url + "/pause?mode=keep")
            assert status == 200 and fakes[0].paused
            assert proxy.replicas[1].admitting and not proxy.replicas[1].healthy  # still stuck
            assert (await post(session, proxy.url + "/resume"))[0] == 200

    run(scenario())


def test_readmission_is_bounded_and_replays_state_that_changed_meanwhile():
    async def scenario():
        async with cluster(2, health_interval_s=0.05, admit_timeout_s=0.3) as (proxy, fakes, session):
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200
            fakes[1].healthy = False
            await wait_for(lambda: not proxy.replicas[1].healthy)
            fakes[1].hang_paths.add("/v1/load_lora_adapter")
            fakes[1].healthy = True
            await wait_for(lambda: "--admit-timeout-s" in proxy.replicas[1].last_error)
            assert not proxy.replicas[1].healthy
            # now it loads slowly; a new adapter published during its replay reaches it too
            # the settings are frozen (agrpo/proxy/settings.py); the test changes the one instance the running proxy
            # and its health loop share, as a restart with a longer timeout would
            object.__setattr__(proxy.settings, "admit_timeout_s", 30)
            fakes[1].hang_paths.clear()
            fakes[1].load_delay_s = 0.4
            await wait_for(lambda: proxy.replicas[1].admitting)
            v2 = {**LOAD, "lora_name": "trl-policy-v2", "lora_path": "/a/v2"}
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", v2))[0] == 200
            await wait_for(lambda: proxy.replicas[1].healthy)
            assert fakes[1].loaded == {"trl-policy-v1", "trl-policy-v2"}

    run(scenario())
