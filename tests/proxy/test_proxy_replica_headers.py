"""A replica's own X-Agrpo-* response headers never reach a client (issue 42, item 5): the proxy's X-Agrpo-Replica is
the only one, on buffered and streamed completions through both servers and on what is passed through as it is.
Before, a replica's `X-Agrpo-Replica: 7` came first and the rollout loop's client (agrpo/trainer/rollout/client.py),
which reads the first, counted turns against a replica that does not exist. The real proxy on loopback in front of
fake replicas that add headers of their own (tests/proxy/proxy_fakes.py; no vLLM needed to see what the proxy
relays)."""

import asyncio

import aiohttp
import pytest
from proxy_fakes import FakeReplica, completion

from agrpo.proxy import ProxyServer, ProxySettings
from agrpo.proxy.upstream import REPLICA_HEADER, response_headers

PLANTED = [("X-Agrpo-Replica", "7"), ("x-agrpo-replica", "8"), ("X-AGRPO-Tenant", "other"), ("X-Kept", "yes")]


class ChattyReplica(FakeReplica):
    """A fake replica that sets agrpo's headers on every answer (a buggy or hostile replica, or a proxy in a chain)."""

    def app(self):
        app = super().app()

        async def plant(request, response):
            for name, value in PLANTED:
                response.headers.add(name, value)

        app.on_response_prepare.append(plant)
        return app


def test_response_headers_drop_the_replicas_own_agrpo_headers_whatever_their_case():
    class Replica:
        index = 0

    kept = response_headers([*PLANTED, ("Content-Type", "application/json")], Replica())
    assert kept == [("X-Kept", "yes"), ("Content-Type", "application/json"), (REPLICA_HEADER, "0")]
    assert response_headers(PLANTED, None) == [("X-Kept", "yes")]


async def relayed(lean_front: bool) -> list[tuple[str, list[str], list[str]]]:
    """(what, X-Agrpo-* headers the client got, X-Kept values) for a buffered completion, a stream and /v1/models."""
    fake = ChattyReplica(name="r0")
    await fake.start()
    proxy = ProxyServer(ProxySettings(upstreams=[fake.url], port=0, health_interval_s=0.2, lean_front=lean_front))
    await proxy.start()
    seen = []
    try:
        async with aiohttp.ClientSession() as session:
            for what, method, path, payload in (
                ("buffered", "POST", "/v1/completions", completion([1, 2, 3], model="base")),
                ("stream", "POST", "/v1/completions", completion([1, 2, 3], model="base", stream=True)),
                ("passed through", "GET", "/v1/models", None),
            ):
                async with session.request(method, proxy.url + path, json=payload) as response:
                    await response.read()
                    assert response.status == 200, (what, response.status)
                    own = [f"{k}: {v}" for k, v in response.headers.items() if k.lower().startswith("x-agrpo-")]
                    seen.append((what, own, response.headers.getall("X-Kept", [])))
    finally:
        await proxy.stop()
        await fake.stop()
    return seen


@pytest.mark.parametrize("lean_front", [True, False])
def test_the_client_gets_the_proxys_replica_header_only(lean_front):
    seen = asyncio.run(relayed(lean_front))
    assert seen == [
        ("buffered", [f"{REPLICA_HEADER}: 0"], ["yes"]),
        ("stream", [f"{REPLICA_HEADER}: 0"], ["yes"]),
        ("passed through", [f"{REPLICA_HEADER}: 0"], ["yes"]),
    ]
