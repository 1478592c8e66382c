"""The lean front over raw sockets: keep-alive, pipelining, bodies in pieces, hand-over to
aiohttp for everything else, refused ambiguous heads; and the aiohttp-only mode."""

import asyncio
import json

import aiohttp
import pytest
from proxy_fakes import cluster, completion, content_length, open_to, post, wait_until

from agrpo.proxy.front import IDLE_CLOSE_S, close_idle

BODY = json.dumps(completion([1, 2, 3])).encode()


def run(coro):
    return asyncio.run(coro)


def request(path=b"/v1/completions", body=BODY, method=b"POST", extra=b""):
    return (
        method
        + b" "
        + path
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    return head, await reader.readexactly(content_length(head))


def test_keep_alive_pipelining_and_a_body_in_pieces_on_one_connection():
    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            reader, writer = await open_to(proxy)
            writer.write(request() + request())  # two requests in one write
            for _ in range(2):
                head, body = await read_response(reader)
                assert head.startswith(b"HTTP/1.1 200 OK") and b"X-Agrpo-Replica: 0" in head
                assert b"aiohttp" not in head  # answered by the front, not aiohttp's server
                assert json.loads(body)["served_by"] == "r0"
            raw = request()
            for i in range(0, len(raw), 7):  # the head and the body trickle in
                writer.write(raw[i : i + 7])
                await writer.drain()
                await asyncio.sleep(0.001)
            head, _ = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 200 OK")
            writer.write(request(extra=b"Connection: close\r\n"))
            head, _ = await read_response(reader)
            assert b"Connection: close" in head
            assert await reader.read() == b""  # then the proxy closed the connection
            writer.close()
            assert [s[2] for s in fakes[0].requests("/v1/completions")] == [BODY] * 4
            assert proxy.budget.held == 0 and proxy.front_connections == set()

    run(scenario())


def test_other_requests_hand_the_connection_to_aiohttp_which_serves_it_to_the_end():
    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            reader, writer = await open_to(proxy)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["healthy"] == 1
            writer.write(request())  # now served by aiohttp's server, same answer
            head, body = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 200") and b"X-Agrpo-Replica: 0" in head
            assert b"Server: Python" in head and b"aiohttp" in head  # aiohttp's server answered
            assert json.loads(body)["served_by"] == "r0"
            writer.close()

    run(scenario())


@pytest.mark.parametrize(
    "extra",
    [
        b"X-Bad: a\nInjected: b\r\n",  # a bare LF inside a value
        b"X-Bad: a\rb\r\n",  # a bare CR
        b"Bad Name: 1\r\n",  # a space in a header name
        b"Content-Length: 5\r\n",  # a second Content-Length
    ],
)
def test_ambiguous_heads_are_never_forwarded_as_they_are(extra):
    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            reader, writer = await open_to(proxy)
            writer.write(request(extra=extra))
            answer = await asyncio.wait_for(reader.read(4096), 10)
            writer.close()
            assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), answer[:100]
            assert fakes[0].requests("/v1/completions") == []

    run(scenario())


@pytest.mark.parametrize("lean_front", [True, False])
def test_both_servers_route_stream_and_refuse_the_same_way(lean_front):
    async def scenario():
        async with cluster(2, lean_front=lean_front) as (proxy, fakes, session):
            status, headers, body = await post(session, proxy.url + "/v1/completions", completion([4, 5, 6]))
            index = int(headers["X-Agrpo-Replica"])
            assert status == 200 and json.loads(body)["served_by"] == f"r{index}"
            status, _, body = await post(session, proxy.url + "/v1/completions", data=b'{"prompt": [1], "n": -1}')
            assert status == 400 and "'n'" in json.loads(body)["error"]["message"]
            async with session.post(proxy.url + "/v1/completions", json=completion([4, 5, 6], stream=True)) as response:
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
            for fake in fakes:
                fake.stream_end = "cut"
            with pytest.raises(aiohttp.ClientPayloadError):
                async with session.post(
                    proxy.url + "/v1/completions", json=completion([4, 5, 6], stream=True)
                ) as response:
                    await response.read()
            for fake in fakes:
                await fake.stop()
            status, _, body = await post(session, proxy.url + "/v1/completions", completion([9]))
            assert status == 502 and "no replica could serve" in body.decode()

    run(scenario())


def test_idle_connections_are_closed_and_stalled_bodies_get_408_and_release_the_budget():
    async def scenario():
        async with cluster(1) as (proxy, fakes, _):
            idle_reader, idle_writer = await open_to(proxy)
            idle_writer.write(request())
            await read_response(idle_reader)  # served, then silent
            stalled_reader, stalled_writer = await open_to(proxy)
            raw = request()
            stalled_writer.write(raw[:-5])  # the head and most of the body, then nothing
            await wait_until(lambda: proxy.budget.held == len(BODY) - 5)  # the bytes received, not the declared
            now = asyncio.get_running_loop().time()
            assert close_idle(proxy, now) == 0  # nobody idle or slow for long yet
            assert close_idle(proxy, now + IDLE_CLOSE_S) == 2
            assert await idle_reader.read() == b""
            head, body = await read_response(stalled_reader)
            assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head
            assert "--request-read-timeout-s" in json.loads(body)["error"]["message"]
            assert await stalled_reader.read() == b""
            await wait_until(lambda: proxy.front_connections == set())
            assert proxy.budget.held == 0
            assert fakes[0].requests("/v1/completions")[0][2] == BODY
            assert len(fakes[0].requests("/v1/completions")) == 1
            idle_writer.close()
            stalled_writer.close()

    run(scenario())
