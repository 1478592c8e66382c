"""Who may change the proxy's state, where the upstream token goes, which URLs are replicas.

Fake replicas (tests/proxy/proxy_fakes.py) stand in for vLLM: the behaviour under test is the
proxy's own (the 401s, the refused URLs, the headers it sends).
"""

import asyncio
import json
import logging

import pytest
from proxy_fakes import FakeReplica, cluster, completion, post

from agrpo.proxy import ProxyServer, ProxySettings
from agrpo.proxy.settings import canonical_url, is_loopback, may_receive_token, url_problems
from agrpo.proxy.trust import AdminGuard

ADMIN = "admin-secret-42"
GOOD = {"Authorization": f"Bearer {ADMIN}"}
LOAD = {"lora_name": "trl-policy-v1", "lora_path": "/a/v1", "load_inplace": False}


def run(coro):
    return asyncio.run(coro)


def message(body: bytes) -> str:
    return json.loads(body)["error"]["message"]


async def call(session, method, url, payload=None, headers=None):
    async with session.request(method, url, json=payload, headers=headers) as response:
        return response.status, await response.read()


def test_admin_guard_checks_the_bearer_token():
    guard = AdminGuard("tok")
    assert guard.allows("Bearer tok") and guard.allows("bearer  tok ")
    for wrong in (None, "", "tok", "Bearer", "Bearer to", "Bearer tok2", "Basic tok"):
        assert not guard.allows(wrong), wrong
    assert AdminGuard(None).allows(None)  # no token configured: open, as before


def test_admin_calls_need_the_token_and_routed_traffic_stays_open(monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_ADMIN", ADMIN)

    async def scenario():
        async with cluster(2, admin_token_env="AGRPO_TEST_ADMIN") as (proxy, fakes, session):
            extra = FakeReplica(name="extra")
            await extra.start()
            admin_calls = [
                ("POST", "/v1/load_lora_adapter", LOAD),
                ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
                ("POST", "/pause?mode=keep", None),
                ("POST", "/resume", None),
                ("POST", "/reset_prefix_cache", None),
                ("POST", "/sleep", None),
                ("POST", "/wake_up", None),
                ("POST", "/collective_rpc", {"m": 1}),
                ("POST", "/proxy/replicas", {"url": extra.url}),
                ("DELETE", "/proxy/replicas", {"url": fakes[0].url}),
            ]
            try:
                for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN}):
                    for method, path, payload in admin_calls:
                        status, body = await call(session, method, proxy.url + path, payload, headers)
                        assert status == 401, (path, headers)
                        assert "admin" in message(body)
                # nothing reached a replica, and membership did not change
                assert all(f.seen == [] or {s[1] for s in f.seen} == {"/health"} for f in fakes)
                assert len(proxy.replicas) == 2 and extra.seen == []
                # open: routed traffic, reads, stats
                assert (await post(session, proxy.url + "/v1/completions", completion([1, 2])))[0] == 200
                for path in ("/v1/models", "/health", "/metrics", "/proxy/stats"):
                    async with session.get(proxy.url + path) as response:
                        assert response.status == 200, path
                async with session.get(proxy.url + "/server_info") as response:  # vLLM's dev endpoints: the token
                    assert response.status == 401
                async with session.get(proxy.url + "/server_info", headers=GOOD) as response:
                    assert response.status == 200
                # with the token: every admin call works, and the token is never forwarded
                assert (await post(session, proxy.url + "/v1/load_lora_adapter", LOAD, headers=GOOD))[0] == 200
                assert (await post(session, proxy.url + "/pause?mode=keep", headers=GOOD))[0] == 200
                assert (await post(session, proxy.url + "/resume", headers=GOOD))[0] == 200
                assert (await call(session, "POST", proxy.url + "/proxy/replicas", {"url": extra.url}, GOOD))[0] == 201
                assert (await call(session, "DELETE", proxy.url + "/proxy/replicas", {"url": extra.url}, GOOD))[
                    0
                ] == 200
                seen = [s for f in (*fakes, extra) for s in f.seen]
                assert all(ADMIN not in repr(s[3]) for s in seen)
                assert all(f.loaded == {"trl-policy-v1"} for f in fakes)
            finally:
                await extra.stop()

    run(scenario())


def test_empty_admin_token_variable_refuses_to_start(monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_ADMIN", "  ")
    with pytest.raises(ValueError, match="AGRPO_TEST_ADMIN"):
        ProxyServer(ProxySettings(upstreams=["http://127.0.0.1:1"], admin_token_env="AGRPO_TEST_ADMIN"))


@pytest.mark.parametrize(
    "url,reason",
    [
        ("ftp://h:1", "http or https"),
        ("http://user:pw@h:1", "credentials"),
        ("http://h:1/v1", "path"),
        ("http://h:1?x=1", "query"),
        ("http://h:1/#f", "fragment"),
        ("http://h:99999", "port"),
        ('http://h"}x:1', "host"),
        ("http://h :1", "spaces"),
    ],
)
def test_replica_urls_are_scheme_host_port_only(url, reason):
    problems = url_problems(url)
    assert len(problems) == 1 and (url in problems[0] or "pw" not in problems[0])
    words = {
        "query": "path, query",
        "fragment": "fragment",
        "path": "path",
        "spaces": "spaces",
        "http or https": "http or https",
        "credentials": "credentials",
        "port": "port",
        "host": "host",
    }
    assert words[reason] in problems[0]
    for good in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", "https://abc--8000.hf.jobs", "http://[::1]:8000"):
        assert url_problems(good) == []


@pytest.mark.parametrize(
    "url,canonical",
    [
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("HTTP://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://0x7f.1:8000", "http://127.0.0.1:8000"),
        ("http://127.1:8000", "http://127.0.0.1:8000"),
        ("http://2130706433:8000", "http://127.0.0.1:8000"),
        ("http://0177.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://[::ffff:7f00:1]:8000", "http://127.0.0.1:8000"),
        ("http://[0:0::1]:8000", "http://[::1]:8000"),
        ("https://ABC--8000.HF.Jobs", "https://abc--8000.hf.jobs"),
        ("https://abc--8000.hf.jobs:443", "https://abc--8000.hf.jobs"),
        ("http://localhost.:80", "http://localhost"),
    ],
)
def test_one_server_has_one_canonical_url(url, canonical):
    assert canonical_url(url) == canonical


@pytest.mark.parametrize(
    "url,reason",
    [
        ("http://..:8000", "not a host name"),
        ("http://a..b:8000", "not a host name"),
        ("http://-a:8000", "not a host name"),
        ("http://127.0.0.1:0", "port"),
        ("http://127.0.0.1:", "empty port"),
        ("http://[127.0.0.1]:1", "invalid host"),
        ("http://[fe80::1%25eth0]:1", "zone"),
        ("http://999.1.1.1:1", "out of range"),
        ("http://08.1.1.1:1", "octal"),
    ],
)
def test_hosts_no_resolver_takes_and_port_0_are_refused(url, reason):
    problems = url_problems(url)
    assert len(problems) == 1 and reason in problems[0], problems


def test_runtime_replica_urls_are_checked_before_anything_is_sent():
    async def scenario():
        async with cluster(1) as (proxy, fakes, session):
            port = fakes[0].port
            for url in (
                f"http://user:pw@127.0.0.1:{port}",
                f"http://127.0.0.1:{port}/steal?x=1",
                f"http://127.0.0.1:{port}/#x",
                f"file://127.0.0.1:{port}",
                7,
            ):
                status, body = await call(session, "POST", proxy.url + "/proxy/replicas", {"url": url})
                assert status == 400 and "not a replica URL" in message(body)
            assert len(proxy.replicas) == 1
            assert "pw" not in (await call(session, "GET", proxy.url + "/metrics"))[1].decode()

    run(scenario())


def test_upstream_token_goes_only_to_start_hosts_and_allowed_patterns(monkeypatch):
    monkeypatch.setenv("AGRPO_TEST_TOKEN", "hf_secret")
    assert may_receive_token("abc--8000.hf.jobs", {"127.0.0.1"}, ["*.hf.jobs"])
    assert not may_receive_token("evil.example", {"127.0.0.1"}, ["*.hf.jobs"])
    assert not may_receive_token("hf.jobs.evil.example", set(), ["*.hf.jobs"])

    async def scenario():
        async with cluster(1, token_env="AGRPO_TEST_TOKEN") as (proxy, fakes, session):
            other = FakeReplica(name="other")  # same machine, but named by another host
            await other.start()
            try:
                assert (await post(session, proxy.url + "/proxy/replicas", {"url": f"http://localhost:{other.port}"}))[
                    0
                ] == 201
                await post(session, proxy.url + "/v1/load_lora_adapter", LOAD)
                for g in range(8):
                    await post(session, proxy.url + "/v1/completions", completion([g] * 20))
                assert other.requests("/v1/completions") and other.requests("/health")
                assert all("Authorization" not in s[3] for s in other.seen)
                assert fakes[0].seen
                assert all(s[3]["Authorization"] == "Bearer hf_secret" for s in fakes[0].seen)
            finally:
                await other.stop()
        async with cluster(1, token_env="AGRPO_TEST_TOKEN", token_hosts="localhost") as (proxy, fakes, session):
            other = FakeReplica(name="other")
            await other.start()
            try:
                await post(session, proxy.url + "/proxy/replicas", {"url": f"http://localhost:{other.port}"})
                assert other.seen
                assert all(s[3]["Authorization"] == "Bearer hf_secret" for s in other.seen)
            finally:
                await other.stop()

    run(scenario())


def test_binding_beyond_loopback_without_admin_token_warns(caplog, monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.1") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("::")
    monkeypatch.setenv("AGRPO_TEST_ADMIN", ADMIN)

    async def start_and_stop(**extra):
        proxy = ProxyServer(ProxySettings(upstreams=["http://127.0.0.1:1"], port=0, health_interval_s=60, **extra))
        await proxy.start()
        await proxy.stop()

    with caplog.at_level(logging.WARNING, logger="agrpo.proxy"):
        run(start_and_stop(host="0.0.0.0"))
    assert any("without an admin token" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agrpo.proxy"):
        run(start_and_stop(host="0.0.0.0", admin_token_env="AGRPO_TEST_ADMIN"))
        run(start_and_stop(host="127.0.0.1"))
    assert not any("without an admin token" in r.getMessage() for r in caplog.records)
