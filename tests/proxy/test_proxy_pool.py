"""The routed path's own HTTP/1.1 client against a raw socket server that answers exactly the
bytes each test scripts (body framings vLLM's uvicorn may use, and connections it closes)."""

import asyncio
from types import SimpleNamespace

import pytest
from proxy_fakes import content_length

from agrpo.proxy.pool import Exchange, Pool, UpstreamClosed


def run(coro):
    return asyncio.run(coro)


class Scripted:
    """Answers the n-th request on any connection with answers[n]; optionally closes after."""

    def __init__(self, answers, close_after=()):
        self.answers, self.close_after = list(answers), set(close_after)
        self.requests, self.connections = [], 0

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = content_length(head)
                body = await reader.readexactly(length)
                index = len(self.requests)
                self.requests.append((head, body))
                writer.write(self.answers[index])
                await writer.drain()
                if index in self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.replica = SimpleNamespace(url=f"http://127.0.0.1:{port}", authorization=None, exchanges=set())
        return self

    async def __aexit__(self, *exc):
        self.server.close()


async def exchange(pool, replica, body=b"{}", method="POST", timeout=5.0):
    ex = Exchange(pool, replica, timeout)
    try:
        response = await ex.send(method, "/v1/completions", b"X-Test: 1\r\n", body)
        return response.status, dict(response.headers), await response.read()
    finally:
        ex.finish()


def test_content_length_chunked_and_close_delimited_bodies():
    answers = [
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'3;ext=1\r\n{"b\r\n4\r\n":2}\r\n0\r\nX-Trailer: t\r\n\r\n',
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close",
    ]

    async def scenario():
        async with Scripted(answers, close_after={3}) as up:
            pool = Pool(connect_timeout_s=5)
            assert (await exchange(pool, up.replica))[::2] == (200, b'{"a":1}')
            assert (await exchange(pool, up.replica))[::2] == (200, b'{"b":2}')
            assert (await exchange(pool, up.replica))[::2] == (404, b"no")
            assert (await exchange(pool, up.replica))[::2] == (200, b"until-close")
            assert up.connections == 1  # one keep-alive connection served all four
            head, body = up.requests[0]
            assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"X-Test: 1\r\n" in head and b"Content-Length: 2\r\n" in head and body == b"{}"
            pool.close()

    run(scenario())


def test_a_keep_alive_connection_the_replica_closed_is_retried_on_a_fresh_one():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def scenario():
        async with Scripted([ok, ok], close_after={0}) as up:
            pool = Pool(connect_timeout_s=5)
            assert (await exchange(pool, up.replica))[0] == 200
            await asyncio.sleep(0.05)  # the replica has closed the idle connection by now
            assert (await exchange(pool, up.replica))[::2] == (200, b"ok")
            assert up.connections == 2
            pool.close()

    run(scenario())


def test_a_response_cut_short_and_a_hung_replica_raise():
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part"

    async def scenario():
        async with Scripted([cut], close_after={0}) as up:
            pool = Pool(connect_timeout_s=5)
            with pytest.raises(UpstreamClosed):
                await exchange(pool, up.replica)
        async with Scripted([b"HTTP/1.1 200 OK\r\n"]) as up:  # a head that never ends
            with pytest.raises(asyncio.TimeoutError):
                await exchange(Pool(connect_timeout_s=5), up.replica, timeout=0.2)

    run(scenario())


def test_head_requests_expect_no_body():
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]

    async def scenario():
        async with Scripted(answers) as up:
            pool = Pool(connect_timeout_s=5)
            assert (await exchange(pool, up.replica, b"", method="HEAD"))[::2] == (200, b"")
            assert (await exchange(pool, up.replica))[::2] == (200, b"ok")
            assert up.connections == 1
            pool.close()

    run(scenario())


def test_a_dropped_exchange_raises_at_once_and_is_not_retried_on_a_fresh_connection():
    """The control plane drops the routed requests of a replica that stopped answering (agrpo/proxy/health.py): the
    one waiting gets UpstreamClosed (the routed path then tries another replica), even on a reused connection that
    got no byte back, which would otherwise be retried once on a fresh connection to the same replica."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def scenario():
        async with Scripted([ok, b""]) as up:  # the second request is never answered
            pool = Pool(connect_timeout_s=5)
            assert (await exchange(pool, up.replica))[0] == 200
            ex = Exchange(pool, up.replica, 3600)
            waiting = asyncio.create_task(ex.send("POST", "/v1/completions", b"", b"{}"))
            while len(up.requests) < 2:
                await asyncio.sleep(0.01)
            assert up.replica.exchanges == {ex}
            for dropped in list(up.replica.exchanges):
                dropped.drop("replica 0 stopped answering")
            with pytest.raises(UpstreamClosed, match="stopped answering"):
                await asyncio.wait_for(waiting, 30)  # a bound on a hang, not a measurement
            ex.finish()
            assert up.replica.exchanges == set() and up.connections == 1
            pool.close()

    run(scenario())
