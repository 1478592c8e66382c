"""What passes through the keyed proxy, and what a bad request leaves in its log (issue 30, item 3).

On main 8d01b7e, `/server_info`, `/openapi.json`, `/docs` and `/get_world_size` passed through without the admin
token; a client's `X-Forwarded-For` and `X-Agrpo-Replica` reached the replicas; malformed requests wrote tracebacks
into the proxy log. The pure parts are tested without sockets; then the real proxy on loopback in front of fake
replicas (tests/proxy/proxy_fakes.py), which record every request and its headers: no vLLM is needed to see what
the proxy forwards.
"""

import asyncio
import logging

import aiohttp.http_exceptions
import pytest
from proxy_fakes import cluster, completion, open_to, post

from agrpo.proxy.trust import open_without_token
from agrpo.proxy.upstream import OneLineLog, forwarded_head_lines

ADMIN = "admin-secret-30h"
GOOD = {"Authorization": f"Bearer {ADMIN}"}
LOAD = {"lora_name": "trl-policy-v1", "lora_path": "/a/v1", "load_inplace": False}
HOSTILE = {  # each must stop at the proxy
    "Connection": "keep-alive, X-Named-Hop",
    "X-Named-Hop": "1",
    "Keep-Alive": "timeout=5",
    "TE": "trailers",
    "Trailer": "X-Late",
    "Proxy-Authorization": "Basic eDp5",
    "Proxy-Connection": "keep-alive",
    "X-Agrpo-Replica": "1",
    "X-Agrpo-Anything": "1",
    "X-Forwarded-For": "6.6.6.6",
    "X-Forwarded-Host": "evil",
    "Forwarded": "for=6.6.6.6",
    "X-Real-IP": "6.6.6.6",
}
KEPT = {"X-Client-Trace": "abc", "Content-Type": "application/json"}


def test_hop_by_hop_agrpo_and_forwarding_headers_are_not_forwarded():
    raw = [(k.encode(), v.encode()) for k, v in {**HOSTILE, **KEPT, "Authorization": "Bearer x"}.items()]
    raw.append((b"x-FORWARDED-proto", b"https"))
    lines = forwarded_head_lines(raw)
    assert lines == b"X-Client-Trace: abc\r\nContent-Type: application/json\r\n"
    assert forwarded_head_lines([(b"Connection", b"close"), (b"X-A", b"\xff")]) == b"X-A: \xff\r\n"  # bytes as sent


@pytest.mark.parametrize(
    "method, path, open_",
    [
        ("GET", "/v1/models", True),
        ("HEAD", "/version", True),
        ("GET", "/ping", True),
        ("POST", "/tokenize", True),
        ("OPTIONS", "/detokenize", True),
        ("GET", "/server_info", False),
        ("GET", "/openapi.json", False),
        ("GET", "/docs", False),
        ("GET", "/redoc", False),
        ("GET", "/get_world_size", False),
        ("GET", "/is_paused", False),
        ("GET", "/load", False),
        ("POST", "/collective_rpc", False),
        ("POST", "/v1/models", False),
        ("DELETE", "/tokenize", False),
    ],
)
def test_only_listed_reads_and_posts_are_open_without_the_token(method, path, open_):
    assert open_without_token(method, path) is open_


def test_a_clients_bad_request_is_one_log_line_and_a_bug_keeps_its_traceback(caplog):
    log = OneLineLog(logging.getLogger("test.one_line"))
    bad = aiohttp.http_exceptions.BadHttpMessage("Invalid character in Content-Length", headers=None)
    with caplog.at_level(logging.DEBUG, logger="test.one_line"):
        log.exception("Error handling request from %s", "127.0.0.1", exc_info=bad)
        log.exception("Unhandled exception", exc_info=RuntimeError("a bug"))
    first, second = caplog.records
    assert first.levelno == logging.INFO and first.exc_info is None and "\n" not in first.getMessage()
    assert "127.0.0.1" in first.getMessage() and "Invalid character in Content-Length" in first.getMessage()
    assert second.levelno == logging.ERROR and second.exc_info is not None


def test_informational_and_dev_endpoints_need_the_token_through_the_proxy(monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_ADMIN", ADMIN)

    async def scenario():
        async with cluster(1, admin_token_env="AGRPO_TEST_ADMIN") as (proxy, fakes, session):
            closed = ["/server_info", "/openapi.json", "/docs", "/redoc", "/get_world_size", "/is_paused", "/load"]
            for path in closed:
                async with session.get(proxy.url + path) as response:
                    assert response.status == 401, path
            assert (await post(session, proxy.url + "/collective_rpc", {"method": "x"}))[0] == 401
            assert {s[1] for s in fakes[0].seen} <= {"/health"}  # nothing reached the replica
            for path in closed:
                async with session.get(proxy.url + path, headers=GOOD) as response:
                    assert response.status in (200, 404), path  # the fake knows /server_info only
            assert [s[1] for s in fakes[0].seen if s[1] != "/health"] == closed
            for path in ("/v1/models", "/version", "/ping"):
                async with session.get(proxy.url + path) as response:
                    assert response.status in (200, 404), path
            assert fakes[0].requests("/ping")  # reached the replica without the token

    asyncio.run(scenario())


@pytest.mark.parametrize("lean_front", [True, False])
def test_the_replica_never_sees_a_clients_hop_by_hop_agrpo_or_forwarding_headers(monkeypatch, lean_front):
    monkeypatch.setenv("AGRPO_TEST_ADMIN", ADMIN)

    async def scenario():
        async with cluster(1, admin_token_env="AGRPO_TEST_ADMIN", lean_front=lean_front) as (proxy, fakes, session):
            headers = {**HOSTILE, **KEPT}
            assert (await post(session, proxy.url + "/v1/completions", completion([1]), headers=headers))[0] == 200
            assert (await post(session, proxy.url + "/v1/chat/completions", {"messages": []}, headers=headers))[0]
            async with session.get(proxy.url + "/v1/models", headers=headers) as response:
                assert response.status == 200
            admin = {**headers, **GOOD}
            assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD, headers=admin))[0] == 200
            seen = [s for s in fakes[0].seen if s[1] != "/health"]
            assert [s[1] for s in seen] == [
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/models",
                "/v1/load_lora_adapter",
            ]
            for method, path, _, got in seen:
                names = {name.lower() for name in got}
                assert not names & {name.lower() for name in HOSTILE}, (path, names)
                assert "authorization" not in names  # neither the client's nor (no --token-env) any other
            assert all(s[3].get("X-Client-Trace") == "abc" for s in seen[:3])  # end-to-end headers pass

    asyncio.run(scenario())


BAD = [
    b"GARBAGE\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n\xff\xfe{",
]


@pytest.mark.parametrize("lean_front", [True, False])
def test_malformed_requests_are_answered_400_and_log_one_line_each_without_a_traceback(caplog, lean_front):
    async def scenario():
        async with cluster(1, lean_front=lean_front) as (proxy, fakes, _):
            for raw in BAD:
                reader, writer = await open_to(proxy)
                writer.write(raw)
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n"), 15)  # the status line
                assert answer.split(b" ", 2)[1] == b"400", raw
                writer.close()
            # a client that leaves mid-body (behind aiohttp, its handler was reading it)
            reader, writer = await open_to(proxy)
            writer.write(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            await asyncio.sleep(0.2)
            writer.transport.abort()
            await asyncio.sleep(0.3)
            assert {s[1] for s in fakes[0].seen} <= {"/health"}

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "agrpo"))]
    assert not [r for r in records if r.exc_info or "Traceback" in r.getMessage()]
    about_requests = [r for r in records if "request" in r.getMessage() or "the client left" in r.getMessage()]
    assert 4 <= len(about_requests) <= len(BAD) + 1  # one line per bad request (a 400 answered by the front: none)
    assert all("\n" not in r.getMessage() for r in records)
