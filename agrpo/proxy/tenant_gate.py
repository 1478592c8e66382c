"""The routed path of a shared fleet (`--tenancy`): who asks, may they, when may they go, what did they get.

Called from agrpo/proxy/routed.py only when the proxy runs with `--tenancy`; without it the routed path does not
touch this module. Per request it costs one header scan, one sha256 of the token, a dict lookup, the fair-share
bookkeeping (fair_share.py) and, on the answer, one `rfind` for `"completion_tokens"` (the usage block ends vLLM's
answer: the body is never parsed). A 404 "does not exist" for an adapter the proxy loaded (the replica lost it) is
answered by reloading it there and trying once more (`reload_evicted`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

from agrpo.proxy import broadcast
from agrpo.proxy.fair_share import FairShare
from agrpo.proxy.tenants import Tenant, TenantRegistry, model_refusal
from agrpo.proxy.upstream import error_body

log = logging.getLogger("agrpo.proxy")

_USAGE = b'"completion_tokens"'
_COUNT = re.compile(rb"\s*:\s*(\d{1,12})")
_EVENT = b"data: {"
JSON = [("Content-Type", "application/json")]
GONE = (
    "this run's tenancy ended while its request waited for its fair share (its lease lapsed or it was unregistered): "
    "register again (POST /fleet/tenants)"
)


def completion_tokens(body: bytes) -> int:
    """`usage.completion_tokens` of an answer, found from its end without parsing it (0 when absent)."""
    at = body.rfind(_USAGE)
    if at < 0:
        return 0
    match = _COUNT.match(body, at + len(_USAGE))
    return int(match.group(1)) if match else 0


def authorization_of(raw_headers) -> str | None:
    """The first Authorization header's value among raw (bytes) header pairs."""
    for name, value in raw_headers:
        if len(name) == 13 and name.lower() == b"authorization":
            return value.decode("latin-1")
    return None


class StreamCount:
    """Tokens of a streamed answer: its usage block when it sends one (stream_options.include_usage), else one token
    per event (vLLM sends one per token and choice)."""

    __slots__ = ("tenant", "events", "usage")

    def __init__(self, tenant: Tenant):
        self.tenant = tenant
        self.events = 0
        self.usage: int | None = None

    def feed(self, chunk: bytes) -> None:
        self.events += chunk.count(_EVENT)
        if _USAGE in chunk:
            self.usage = completion_tokens(chunk) or self.usage

    def done(self) -> None:
        got = self.usage if self.usage is not None else self.events
        self.tenant.tokens += got
        self.tenant.tick_tokens += got


class TenantGate:
    """Identity, namespace, fair share and counting for routed requests of a shared fleet."""

    def __init__(self, server, registry: TenantRegistry, fair: FairShare):
        self.server = server
        self.registry = registry
        self.fair = fair

    async def enter(self, sink, raw_headers, model: str, n: int):
        """(tenant or None for the admin, True) when the request may go now, after waiting for its fair share if it
        must; (None, False) once the refusal has been answered."""
        authorization = authorization_of(raw_headers)
        tenant = self.registry.who(authorization)  # a run's token first: nearly every request here carries one
        if tenant is None:
            if self.server.admin.allows(authorization):
                return None, True
            message = (
                "this fleet serves several runs (--tenancy): completions need 'Authorization: Bearer <token>' with "
                "the run's tenant token (from POST /fleet/tenants) or the fleet's admin token"
            )
            await sink.respond(401, JSON + [("WWW-Authenticate", "Bearer")], error_body(401, message, "Unauthorized"))
            return None, False
        refusal = model_refusal(tenant, model, self.server.control.loaded)
        if refusal is not None:
            await sink.respond(403, JSON, error_body(403, refusal, "Forbidden"))
            return None, False
        tenant.request_count += 1
        if self.fair.enter(tenant.id, n):  # under its cap: no wait, no future
            tenant.in_flight += n
            return tenant, True
        if not await self._waited(tenant, n):
            await sink.respond(410, JSON, error_body(410, GONE, "Gone"))
            return None, False
        return tenant, True

    async def _waited(self, tenant: Tenant, n: int) -> bool:
        """Wait behind the tenant's earlier requests for its fair share; False when the tenant left meanwhile."""
        loop = asyncio.get_running_loop()  # its clock is the registry's (tenant_routes.Tenancy._now)
        ticket = loop.create_future()
        self.fair.wait(tenant.id, n, ticket)
        tenant.gate_enter(loop.time())  # the fleet's controller counts these waits as starvation (fleet/signals.py)
        try:
            ok = await ticket
        except asyncio.CancelledError:  # the client left while it waited
            if ticket.done() and not ticket.cancelled() and ticket.result():
                self.leave(tenant, n)  # admitted just before: give the place back
            else:
                self._wake(self.fair.withdraw(tenant.id, ticket))
            raise
        finally:
            tenant.gate_leave(loop.time())
        if ok:
            tenant.in_flight += n
        return ok

    def leave(self, tenant: Tenant, n: int) -> None:
        tenant.in_flight = max(0, tenant.in_flight - n)
        if tenant.id in self.registry.tenants:
            self._wake(self.fair.leave(tenant.id, n))

    @staticmethod
    def _wake(tickets, result: bool = True) -> None:
        for ticket in tickets:
            if not ticket.done():
                ticket.set_result(result)

    def forget(self, tenant: Tenant) -> None:
        """The tenant left the fleet: its waiting requests get 410, and the others may take its share."""
        self._wake(self.fair.forget(tenant.id), False)
        self._wake(self.fair.resize(self.fair.slots))

    def resize(self, slots: int) -> None:
        self._wake(self.fair.resize(slots))

    @staticmethod
    def count(tenant: Tenant, body: bytes) -> None:
        got = completion_tokens(body)
        tenant.tokens += got
        tenant.tick_tokens += got

    async def reload_evicted(self, replica, model: str, body: bytes) -> bool:
        """Whether `body` (a 404) says the replica lost adapter `model` the proxy loaded, and it serves it again now
        (reloaded from the load body the proxy remembers)."""
        control = self.server.control
        load = control.loaded.get(model)
        if load is None or b"does not exist" not in body:
            return False
        reply = await control._send(replica, "POST", "/v1/load_lora_adapter", load)
        if broadcast.serves_adapter(reply) and model not in control.loaded:  # unloaded meanwhile: undo the reload
            await control._send(replica, "POST", "/v1/unload_lora_adapter", json.dumps({"lora_name": model}).encode())
            return False
        if broadcast.serves_adapter(reply):
            log.info("replica %d had lost adapter %s: reloaded it, retrying the request", replica.index, model)
            return True
        log.warning("replica %d lost adapter %s and did not reload it: %s", replica.index, model, reply.summary())
        return False
