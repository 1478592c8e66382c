"""The proxy over HTTP against in-process fake replicas: routing, forwarding, stats, auth."""

import asyncio
import json

from proxy_fakes import cluster, completion, post

SYSTEM = list(range(1000, 1040))  # a shared chat template / system prompt


def run(coro):
    return asyncio.run(coro)


def test_routed_response_names_its_replica_and_body_is_forwarded_untouched():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            raw = b'{"model": "trl-policy-v1",   "prompt": [1, 2,  3], "max_tokens": 4, "x": [1]}'
            status, headers, body = await post(
                session, proxy.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}
            )
            index = int(headers["X-Agrpo-Replica"])
            assert status == 200
            assert json.loads(body)["served_by"] == f"r{index}"
            assert headers["X-Request-Id"] == "r1"
            assert fakes[index].requests("/v1/completions")[0][2] == raw
            assert fakes[1 - index].requests("/v1/completions") == []

    run(scenario())


def test_group_members_sent_concurrently_land_on_one_replica_and_only_first_is_cold():
    async def scenario():
        async with cluster(3) as (proxy, fakes, session):
            groups = [SYSTEM + [7, g] for g in range(6)]  # prompt-specific part < one block
            jobs = [post(session, proxy.url + "/v1/completions", completion(p)) for p in groups for _ in range(8)]
            results = await asyncio.gather(*jobs)
            by_group = {}
            for (status, headers, _), prompt in zip(results, [p for p in groups for _ in range(8)]):
                assert status == 200
                by_group.setdefault(tuple(prompt), set()).add(headers["X-Agrpo-Replica"])
            assert all(len(replicas) == 1 for replicas in by_group.values())
            assert len({r for rs in by_group.values() for r in rs}) == 3  # groups spread out
            async with session.get(proxy.url + "/proxy/stats") as response:
                stats = await response.json()
            assert stats["routed"] == 48
            assert stats["unmatched"] == 6
            assert stats["affinity"] == 42
            assert stats["spilled"] == 0
            assert [r["routed"] for r in stats["replicas"]] == [16, 16, 16]
            assert {r["url"] for r in stats["replicas"]} == {f.url for f in fakes}
            assert all(r["healthy"] and r["inflight"] == 0 for r in stats["replicas"])

    run(scenario())


def test_chat_messages_and_text_prompts_keep_groups_together():
    async def scenario():
        async with cluster(2) as (proxy, _, session):
            chat = {
                "model": "trl-policy-v1",
                "max_tokens": 8,
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
            }
            chat_results = await asyncio.gather(
                *(post(session, proxy.url + "/v1/chat/completions", chat) for _ in range(6))
            )
            text_results = await asyncio.gather(
                *(post(session, proxy.url + "/v1/completions", completion("Q: 3+3? A:")) for _ in range(6))
            )
            assert len({h["X-Agrpo-Replica"] for _, h, _ in chat_results}) == 1
            assert len({h["X-Agrpo-Replica"] for _, h, _ in text_results}) == 1
            assert all(s == 200 for s, _, _ in chat_results + text_results)

    run(scenario())


def test_malformed_json_is_400_and_oversized_body_is_413():
    async def scenario():
        async with cluster(1, max_body_bytes=2048) as (proxy, fakes, session):
            status, _, body = await post(session, proxy.url + "/v1/completions", data=b'{"model": "x", "prompt": [1, 2')
            assert status == 400
            assert "malformed JSON" in json.loads(body)["error"]["message"]
            status, _, body = await post(session, proxy.url + "/v1/completions", data=b"[1, 2]")
            assert status == 400
            status, _, body = await post(session, proxy.url + "/v1/completions", completion(list(range(3000))))
            assert status == 413
            assert "max-body-bytes" in json.loads(body)["error"]["message"]
            assert fakes[0].requests("/v1/completions") == []
            async with session.get(proxy.url + "/proxy/stats") as response:
                assert (await response.json())["rejected"] == 3

    run(scenario())


def test_token_is_sent_upstream_never_the_clients_and_never_shown(monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_TOKEN", "hf_secret_123")

    async def scenario():
        async with cluster(2, token_env="AGRPO_TEST_TOKEN") as (proxy, fakes, session):
            await post(
                session,
                proxy.url + "/v1/completions",
                completion([1, 2, 3]),
                headers={"Authorization": "Bearer client-token"},
            )
            await post(session, proxy.url + "/pause")
            await fakes[1].stop()  # a failing replica produces error text somewhere
            await post(session, proxy.url + "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"})
            seen = [s for fake in fakes for s in fake.seen]
            assert seen and all(s[3].get("Authorization") == "Bearer hf_secret_123" for s in seen)
            texts = []
            for path in ("/proxy/stats", "/metrics", "/health"):
                async with session.get(proxy.url + path) as response:
                    texts.append(await response.text())
            _, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/x"})
            texts.append(body.decode())
            assert not any("hf_secret_123" in text for text in texts)
            assert "client-token" not in repr(seen)

    run(scenario())


def test_streaming_passes_chunks_through_as_they_arrive():
    """The replica holds its stream after the first event until the client has that event: a proxy that buffered
    the stream would never deliver it (wait_for bounds that hang)."""

    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            fakes[0].stream_gap_s, fakes[0].stream_gate = 0.0, asyncio.Event()
            received = []
            async with session.post(proxy.url + "/v1/completions", json=completion([1, 2], stream=True)) as response:
                assert response.headers["Content-Type"].startswith("text/event-stream")
                assert response.headers["X-Agrpo-Replica"] == "0"
                first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 30)
                assert json.loads(first[len(b"data: ") :]) == {"i": 0, "by": "r0"}
                assert not fakes[0].stream_gate.is_set()  # the replica is still holding the rest
                fakes[0].stream_gate.set()
                async for chunk in response.content.iter_any():
                    received.append(chunk)
            text = (first + b"".join(received)).decode()
            assert text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")

    run(scenario())


def test_metrics_are_prometheus_text_with_counters_and_histograms():
    async def scenario():
        async with cluster(2) as (proxy, _, session):
            for _ in range(3):
                await post(session, proxy.url + "/v1/completions", completion([5, 6, 7]))
            async with session.get(proxy.url + "/metrics") as response:
                text = await response.text()
                assert response.headers["Content-Type"].startswith("text/plain")
            assert 'agrpo_proxy_routed_total{kind="cold"} 1' in text
            assert 'agrpo_proxy_routed_total{kind="affinity"} 2' in text
            assert "# TYPE agrpo_proxy_routed_seconds histogram" in text
            assert 'agrpo_proxy_routed_seconds_count{kind="affinity"} 2' in text
            assert 'agrpo_proxy_replica_healthy{replica="1"' in text

    run(scenario())


def test_server_info_reports_one_engine_and_other_paths_reach_one_replica():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            async with session.get(proxy.url + "/server_info?config_format=json") as response:
                info = await response.json()
            assert info["vllm_config"]["parallel_config"]["data_parallel_size"] == 1
            assert info["vllm_config"]["lora_config"] == {"max_lora_rank": 16}
            async with session.get(proxy.url + "/v1/models") as response:
                models = await response.json()
                assert response.status == 200
            assert models["data"][0]["max_model_len"] == 512
            assert sum(len(f.requests("/v1/models")) for f in fakes) == 1
            async with session.get(proxy.url + "/no/such/path") as response:
                assert response.status == 404

    run(scenario())


def test_n_and_batched_prompts_count_as_work_and_stay_together():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            batch = [SYSTEM + [1], SYSTEM + [2]]
            first = await post(session, proxy.url + "/v1/completions", completion(batch, n=4))
            again = await post(session, proxy.url + "/v1/completions", completion(SYSTEM + [2], n=4))
            assert first[1]["X-Agrpo-Replica"] == again[1]["X-Agrpo-Replica"]
            async with session.get(proxy.url + "/proxy/stats") as response:
                stats = await response.json()
            assert (stats["unmatched"], stats["affinity"]) == (1, 1)

    run(scenario())


def test_client_sees_json_error_not_traceback_when_no_replica_answers():
    async def scenario():
        async with cluster(2) as (proxy, fakes, session):
            for fake in fakes:
                await fake.stop()
            status, headers, body = await post(session, proxy.url + "/v1/completions", completion([1, 2]))
            assert status == 502
            error = json.loads(body)["error"]
            assert "no replica could serve" in error["message"]
            assert "Traceback" not in body.decode()
            assert headers["X-Agrpo-Replica"] in ("0", "1")

    run(scenario())


def test_chunked_client_upload_is_accepted():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):

            async def chunks():
                yield b'{"model": "m", '
                yield b'"prompt": [1, 2, 3]}'

            async with session.post(proxy.url + "/v1/completions", data=chunks()) as response:
                assert response.status == 200
            assert fakes[0].requests("/v1/completions")[0][2] == b'{"model": "m", "prompt": [1, 2, 3]}'

    run(scenario())


def test_proxy_binds_loopback_by_default():
    async def scenario():
        async with cluster(1) as (proxy, _, session):
            assert proxy.url.startswith("http://127.0.0.1:")
            async with session.get(proxy.url + "/health") as response:
                assert response.status == 200
                assert (await response.json())["healthy"] == 1

    run(scenario())


def test_connection_is_reused_across_requests():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            for _ in range(5):
                await post(session, proxy.url + "/v1/completions", completion([9]))
            routed_peers = [peer for peer, seen in zip(fakes[0].peers, fakes[0].seen) if seen[1] == "/v1/completions"]
            assert len(routed_peers) == 5 and len(set(routed_peers)) == 1  # one keep-alive

    run(scenario())
