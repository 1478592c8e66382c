"""The proxy against a client or a replica on the same machine that means harm (issue 20, round two).

Each test reproduced a finding against main 7b1b5de before its fix (they fail there). Loopback only, fake
replicas (tests/proxy/proxy_fakes.py) and raw sockets; every loop is bounded and every wait has a hang bound.
"""

import asyncio
import json

import pytest
from proxy_fakes import FakeReplica, cluster, completion, content_length, open_to, post, wait_until

from agrpo.proxy.front import close_idle

LOAD = {"lora_name": "trl-policy-v1", "lora_path": "/a/v1", "load_inplace": False}
HUGE = 64 * 1024 * 1024  # the default --max-body-bytes: a head may declare it


def run(coro):
    return asyncio.run(coro)


def message(body: bytes) -> str:
    return json.loads(body)["error"]["message"]


def head(path=b"/v1/completions", length=0, extra=b""):
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra
        + (b"Content-Length: %d\r\n\r\n" % length)
    )


async def response_of(reader, timeout=15.0) -> tuple[int, bytes]:
    """(status, everything until the proxy closed the connection)."""
    raw = await asyncio.wait_for(reader.read(), timeout)
    return int(raw.split(b" ", 2)[1]), raw


async def one_response(reader) -> tuple[int, bytes]:
    """(status, head and body) of one answer, without waiting for the connection to close (aiohttp lingers)."""
    head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head + await reader.readexactly(content_length(head))


# ---- the body budget counts bytes received ----------------------------------------------------------------------


@pytest.mark.parametrize("lean_front", [True, False])
def test_heads_declaring_huge_bodies_hold_only_the_bytes_they_sent(lean_front):
    """Four connections declaring 64 MiB and sending one byte took the whole 256 MiB budget on main: every
    completion and every adapter load got 503 for as long as they waited."""

    async def scenario():
        async with cluster(2, lean_front=lean_front) as (proxy, fakes, session):
            slow = []
            for _ in range(4):
                reader, writer = await open_to(proxy)
                writer.write(head(length=HUGE) + b"{")
                slow.append(writer)
            await wait_until(lambda: proxy.budget.held == 4, what="4 bytes held")
            status, _, _ = await post(session, proxy.url + "/v1/completions", completion([1, 2]))
            assert status == 200
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200
            assert proxy.budget.refused == 0
            for writer in slow:
                writer.close()
            await wait_until(lambda: proxy.budget.held == 0, what="the budget released")

    run(scenario())


@pytest.mark.parametrize("lean_front", [True, False])
def test_a_request_that_does_not_arrive_within_the_read_deadline_gets_408(lean_front):
    """Dribbling a byte at a time kept a connection (and its body's budget) forever: activity is not progress."""

    async def scenario():
        async with cluster(1, lean_front=lean_front, request_read_timeout_s=0.5) as (proxy, fakes, _):
            reader, writer = await open_to(proxy)
            writer.write(head(length=1000))
            answer = asyncio.ensure_future(one_response(reader))
            for _ in range(15):  # a byte every 20 ms for 0.3 s (then silence, so that our bytes cannot
                writer.write(b" ")  # race the proxy's close into a reset): activity does not move the deadline
                await asyncio.sleep(0.02)
            status, raw = await asyncio.wait_for(answer, 15)
            assert status == 408 and b"--request-read-timeout-s" in raw
            assert fakes[0].requests("/v1/completions") == []
            await wait_until(lambda: proxy.budget.held == 0, what="the budget released")
            writer.close()

    run(scenario())


def test_a_head_that_never_ends_gets_408_from_the_sweep():
    async def scenario():
        async with cluster(1) as (proxy, _, _):
            reader, writer = await open_to(proxy)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            await wait_until(lambda: any(f.reading_since is not None for f in proxy.front_connections))
            now = asyncio.get_running_loop().time()
            assert close_idle(proxy, now + proxy.settings.request_read_timeout_s) == 1
            status, _ = await response_of(reader)
            assert status == 408
            writer.close()

    run(scenario())


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n",
        b"GET /health HTTP/1.1\nHost: x\n\n",
    ],
)
def test_a_bare_lf_head_is_answered_400_at_once(raw):
    """On main the front waited for a CRLF CRLF that never came (80 s)."""

    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            reader, writer = await open_to(proxy)
            writer.write(raw)  # and nothing more: the answer must not wait for the idle sweep
            status, answer = await response_of(reader, timeout=5)
            assert status == 400 and b"bare LF" in answer
            assert {s[1] for s in fakes[0].seen} <= {"/health"}
            writer.close()

    run(scenario())


# ---- answers nobody reads, clients that leave ----------------------------------------------------------------------


def test_pipelined_requests_whose_answers_are_never_read_stop_being_read():
    """One connection pipelining requests without reading grew the proxy by ~90 MB in 30 s: it kept serving them
    into an ever longer write buffer. Now it reads no further request while answers wait to be read."""
    sent = 300

    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            fakes[0].completion_padding = 256 * 1024
            reader, writer = await open_to(proxy)
            one = head(length=len(body := json.dumps(completion([1, 2, 3])).encode())) + body
            for _ in range(sent):
                writer.write(one)
                try:
                    await asyncio.wait_for(writer.drain(), 1)
                except asyncio.TimeoutError:
                    break  # the proxy stopped reading: our socket buffers are full
            await asyncio.sleep(1)
            served = len(fakes[0].requests("/v1/completions"))
            (front,) = proxy.front_connections
            assert served < sent // 2, served  # main served every one of them
            assert front.transport.get_write_buffer_size() <= 2 * (256 * 1024 + 65536)
            writer.transport.abort()
            await wait_until(lambda: proxy.front_connections == set() and proxy.budget.held == 0)

    run(scenario())


@pytest.mark.parametrize("lean_front", [True, False])
def test_a_client_that_leaves_cancels_its_request_upstream(lean_front):
    """On main the replica kept generating for nobody until --total-timeout-s (900 s), counted in the loads."""

    async def scenario():
        async with cluster(1, lean_front=lean_front) as (proxy, fakes, _):
            fakes[0].completion_delay_s = 3600
            reader, writer = await open_to(proxy)
            body = json.dumps(completion([1, 2])).encode()
            writer.write(head(length=len(body)) + body)
            await wait_until(lambda: len(fakes[0].requests("/v1/completions")) == 1, what="the request upstream")
            assert proxy.replicas[0].inflight == 1
            writer.transport.abort()
            await wait_until(lambda: fakes[0].cancelled == 1, what="the upstream request cancelled")
            await wait_until(lambda: proxy.replicas[0].inflight == 0 and proxy.replicas[0].work == 0)

    run(scenario())


# ---- replicas: errors, late successes, retired versions, redirects, headers ------------------------------------


def test_a_load_that_lands_after_the_timeout_is_undone_before_the_replica_serves_again():
    """Replica 0 refuses the load, replica 1 accepts it after the broadcast timeout: on main replica 1 was
    re-admitted holding the version while the error said it was loaded nowhere."""

    async def scenario():
        async with cluster(2, broadcast_timeout_s=1.0, health_interval_s=0.05) as (proxy, fakes, session):
            fakes[0].fail_paths["/v1/load_lora_adapter"] = 500
            fakes[1].load_delay_s = 1.3
            status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
            text = message(body)
            assert status == 500 and "served by none" in text
            assert "replica 0" in text and "answered HTTP 500" in text
            assert "replica 1" in text and "gave no answer" in text
            # The late load lands and the re-admission unloads it at once (probes every 0.05 s): a poll for the
            # landing itself can miss that window on a busy machine, so wait for the undo, which follows it.
            await wait_until(lambda: fakes[1].requests("/v1/unload_lora_adapter"), what="the late load undone")
            await wait_until(lambda: proxy.replicas[1].healthy, what="re-admission")
            assert fakes[1].loaded == set()  # undone before it took traffic again
            assert fakes[0].loaded == set()

    run(scenario())


def test_a_request_for_a_retired_adapter_version_ends_at_once_with_410():
    """The trainer unloaded v1; a request still naming it (here: failing over from a replica that died) got a 404
    from the other replica, which TRL's rollout worker retried for minutes (208 console lines in the issue)."""

    async def scenario():
        async with cluster(2, health_interval_s=30) as (proxy, fakes, session):
            for fake in fakes:
                fake.check_models = True
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200
            first = await post(session, proxy.url + "/v1/completions", completion([7, 7, 7]))
            home = int(first[1]["X-Agrpo-Replica"])
            fakes[home].completion_delay_s = 3600
            pending = asyncio.ensure_future(post(session, proxy.url + "/v1/completions", completion([7, 7, 7])))
            await wait_until(lambda: len(fakes[home].requests("/v1/completions")) == 2, what="the request in flight")
            assert (await post(session, proxy.url + "/v1/unload_lora_adapter", {"lora_name": "trl-policy-v1"}))[
                0
            ] == 200
            await fakes[home].stop()  # the replica dies with the request on it: the proxy fails it over
            status, _, body = await asyncio.wait_for(pending, 30)
            assert status == 410 and json.loads(body)["error"]["type"] == "AdapterRetired"
            assert "retrying cannot succeed" in message(body)
            assert fakes[1 - home].requests("/v1/completions") == []  # never sent to a replica without it
            again = await post(session, proxy.url + "/v1/completions", completion([8]))
            assert again[0] == 410
            async with session.get(proxy.url + "/proxy/stats") as response:
                assert (await response.json())["retired"] == 2
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD))[0] == 200  # the name again
            assert (await post(session, proxy.url + "/v1/completions", completion([8])))[0] == 200

    run(scenario())


def test_redirects_are_never_followed():
    """aiohttp's client follows redirects by default: a replica could send probes and loads (with the upstream
    token) anywhere."""

    async def scenario():
        elsewhere = FakeReplica(name="elsewhere")
        await elsewhere.start()
        try:
            async with cluster(2, health_interval_s=0.05) as (proxy, fakes, session):
                fakes[1].redirects["/v1/load_lora_adapter"] = elsewhere.url + "/v1/load_lora_adapter"
                status, _, body = await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
                assert status == 502 and "replica 1" in message(body) and "HTTP 307" in message(body)
                assert fakes[0].loaded == set()  # rolled back
                fakes[1].redirects["/health"] = elsewhere.url + "/health"
                await wait_until(lambda: not proxy.replicas[1].healthy, what="replica 1 out on a redirecting probe")
                assert elsewhere.seen == []
        finally:
            await elsewhere.stop()

    run(scenario())


async def raw_replica(answer_head: bytes):
    """A replica that answers /health 200 and every other request with `answer_head` and `{}`, bytes as given."""

    async def handle(reader, writer):
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = content_length(request)
                await reader.readexactly(length)
                if request.startswith(b"GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                else:
                    writer.write(answer_head + b"Content-Length: 2\r\n\r\n{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_replica_headers_with_control_characters_never_reach_the_client():
    """A value with an embedded LF was forwarded: the replica could add headers (or a response) of its own."""

    async def scenario():
        server = await raw_replica(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Evil: a\nInjected: yes\r\n"
            b"X-Ctl: a\x01b\r\nBad Name: 1\r\nX-Fine: kept\r\n"
        )
        port = server.sockets[0].getsockname()[1]
        from agrpo.proxy import ProxyServer, ProxySettings

        for lean_front in (True, False):
            proxy = ProxyServer(ProxySettings(upstreams=[f"http://127.0.0.1:{port}"], port=0, lean_front=lean_front))
            await proxy.start()
            try:
                reader, writer = await open_to(proxy)
                body = json.dumps(completion([1])).encode()
                writer.write(head(length=len(body), extra=b"Connection: close\r\n") + body)
                status, raw = await response_of(reader)
                answer_head = raw.split(b"\r\n\r\n", 1)[0]
                assert status == 200 and b"X-Fine: kept" in answer_head
                assert (
                    b"Injected" not in raw and b"X-Evil" not in raw and b"X-Ctl" not in raw and b"Bad Name" not in raw
                )
                writer.close()
            finally:
                await proxy.stop()
        server.close()

    run(scenario())


# ---- replica URLs ----------------------------------------------------------------------------------------------


def test_one_server_under_several_spellings_is_refused_409_and_invalid_hosts_400():
    """`HTTP://127.0.0.1:P`, `0x7f.1` and `[::ffff:7f00:1]` added one server several times; `http://..:P`, port 0
    and `http://[127.0.0.1]:1` passed (or gave a plain-text 500 and a traceback at every probe)."""

    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            port = fakes[0].port
            for url in (
                f"HTTP://127.0.0.1:{port}",
                f"http://0x7f.1:{port}",
                f"http://[::ffff:7f00:1]:{port}/",
                f"http://2130706433:{port}",
            ):
                status, _, body = await post(session, proxy.url + "/proxy/replicas", {"url": url})
                assert status == 409, (url, body)
            for url in ("http://..:8000", "http://127.0.0.1:0", "http://[127.0.0.1]:1", "http://999.1.1.1:5"):
                status, _, body = await post(session, proxy.url + "/proxy/replicas", {"url": url})
                assert status == 400 and "not a replica URL" in message(body), (url, body)
            assert len(proxy.replicas) == 1

    run(scenario())
