"""A proxy with --tenancy in front of fake vLLM replicas that count what each tenant has in flight and answer with a
usage block (tests/proxy/proxy_fakes.py's FakeReplica, which stands in for vLLM; the proxy under test is the real one).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web
from proxy_fakes import FakeReplica, serve

from agrpo.fleet.tenancy import tenant_of

ADMIN = "fleet-admin-secret-0123456789"
ADMIN_ENV = "AGRPO_TEST_FLEET_ADMIN"


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class MeteredReplica(FakeReplica):
    """Answers with `usage.completion_tokens` = `tokens_per_answer`; records the order in which completions arrive
    (`arrivals`: their prompts) and the most each tenant had in flight at once (`peak`: over the fleet when the fakes
    share their counters, as `fleet` makes them)."""

    tokens_per_answer: int = 7
    arrivals: list = field(default_factory=list)
    active: Counter = field(default_factory=Counter)
    peak: Counter = field(default_factory=Counter)

    async def _complete(self, request: web.Request, data: dict) -> web.StreamResponse:
        tenant = tenant_of(data.get("model") or "") or data.get("user") or "base"  # base-model requests: by `user`
        self.arrivals.append(data.get("prompt"))
        self.active[tenant] += 1
        self.peak[tenant] = max(self.peak[tenant], self.active[tenant])
        try:
            answer = await super()._complete(request, data)
        finally:
            self.active[tenant] -= 1
        if data.get("stream") or answer.status != 200:
            return answer
        body = json.loads(answer.body)
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": self.tokens_per_answer, "total_tokens": 10}
        return web.json_response(body)


def fleet(monkeypatch, n: int = 2, **overrides):
    """n started metered fakes, a --tenancy proxy in front of them (admin token ADMIN), and a client session."""
    monkeypatch.setenv(ADMIN_ENV, ADMIN)
    active, peak = Counter(), Counter()  # shared: what each tenant has in flight over the whole fleet
    fakes = [MeteredReplica(name=f"r{i}", active=active, peak=peak) for i in range(n)]
    return serve(fakes, tenancy=True, admin_token_env=ADMIN_ENV, **overrides)


async def call(session, method: str, url: str, payload=None, token: str | None = None):
    """(status, parsed JSON body or the raw text)."""
    headers = bearer(token) if token else None
    async with session.request(method, url, json=payload, headers=headers) as response:
        raw = await response.read()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")


async def register(session, proxy, run: str, lease_s: float = 20.0, versions: int = 2, lora_rank: int = 8):
    status, body = await call(
        session,
        "POST",
        f"{proxy.url}/fleet/tenants",
        {"run": run, "lease_s": lease_s, "versions": versions, "lora_rank": lora_rank},
        ADMIN,
    )
    assert status == 200, body
    return body["tenant"], body["token"]


def load_body(tenant: str, version: int = 1) -> dict:
    return {"lora_name": f"{tenant}/trl-policy-v{version}", "lora_path": f"/runs/{tenant}/v{version}"}


def error(body) -> str:
    return body["error"]["message"] if isinstance(body, dict) else str(body)
