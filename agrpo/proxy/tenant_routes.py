"""A shared fleet's HTTP side (`--tenancy`): the /fleet/tenants routes, the rights of a tenant's token on the admin
routes, and the once-a-second loop that lets lapsed leases go and attributes the replica-seconds.

The rules themselves are pure (tenants.py, fair_share.py); the routed path's part is tenant_gate.py. The contract
(bodies, statuses) is docs/proxy.md's "Tenancy" section and docs/shared_fleet.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from math import isfinite

from aiohttp import web

from agrpo.proxy.tenant_names import tenant_of
from agrpo.proxy.admin_requests import lora_name
from agrpo.proxy.fair_share import FairShare
from agrpo.proxy.tenant_gate import TenantGate
from agrpo.proxy.tenants import PAUSE_REFUSED, NoRoom, Tenant, TenantRegistry, adapter_refusal
from agrpo.proxy.upstream import json_error

log = logging.getLogger("agrpo.proxy")

ADAPTER_PATHS = {"/v1/load_lora_adapter": "load", "/v1/unload_lora_adapter": "unload"}
TICK_S = 1.0
MAX_LEASE_S = 3600.0


def _forbidden(message: str) -> web.Response:
    return json_error(403, message, "Forbidden")


def _gone(tenant_id: str) -> web.Response:
    return json_error(
        404,
        f"tenant {tenant_id[:64]!r} is not on this fleet (its lease lapsed, it was unregistered, or it never was): "
        "register again with POST /fleet/tenants",
        "NotFoundError",
    )


def registration(body: bytes) -> tuple[dict | None, str | None]:
    """The registration fields of a POST /fleet/tenants body, or the problem in words."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return None, 'expected a JSON object like {"run": "gsm8k-r8", "lease_s": 20, "versions": 4, "lora_rank": 8}'
    run, lease_s = data.get("run"), data.get("lease_s", 20.0)
    versions, rank = data.get("versions", 1), data.get("lora_rank", 0)
    if not isinstance(run, str) or not run.strip():
        return None, "'run' must be a non-empty string (the run's name)"
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not (0 < lease_s <= MAX_LEASE_S):
        return None, f"'lease_s' must be a number of seconds above 0 and at most {MAX_LEASE_S:g}"
    if not isfinite(lease_s):
        return None, "'lease_s' must be finite"
    for key, value, least in (("versions", versions, 1), ("lora_rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1 << 16:
            return None, f"'{key}' must be an integer from {least} to 65536"
    return {"run": run.strip()[:200], "lease_s": float(lease_s), "versions": versions, "lora_rank": rank}, None


class Tenancy:
    """The tenants of this proxy's fleet: registry, fair share, the routed gate, routes and the background loop."""

    def __init__(self, server):
        self.server = server
        settings = server.settings
        self.registry = TenantRegistry(settings.max_tenants, settings.max_loras, settings.max_lora_rank)
        self.fair = FairShare(self.slots())
        self.gate = TenantGate(server, self.registry, self.fair)
        self._task: asyncio.Task | None = None
        self._sweep: asyncio.Task | None = None  # unloading the adapters of tenants that are gone
        self._last_tick: float | None = None

    def slots(self) -> int:
        in_rotation = len(self.server.replicas.healthy()) or len(self.server.replicas) or 1
        return self.server.settings.tenant_slots_per_replica * in_rotation

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/fleet/tenants", self.register)
        app.router.add_get("/fleet/tenants", self.list)
        app.router.add_get("/fleet/tenants/{tenant}", self.show)
        app.router.add_delete("/fleet/tenants/{tenant}", self.unregister)
        app.router.add_post("/fleet/tenants/{tenant}/lease", self.lease)

    # ------------------------------------------------------------------ background
    def start(self) -> None:
        self._last_tick = self._now()
        self._task = asyncio.get_running_loop().create_task(self._forever())

    async def stop(self) -> None:
        for task in (self._task, self._sweep):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._sweep = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick()
            except Exception:  # the loop must outlive any one bad tick
                log.exception("tenancy tick failed")

    async def tick(self) -> None:
        """Attribute the replica-seconds since the last tick, follow the replica count, let lapsed leases go, and
        unload (in the background) every adapter whose tenant is gone: a lapsed one's, or one whose load landed after
        its tenant left."""
        now = self._now()
        dt, self._last_tick = now - (self._last_tick or now), now
        self.registry.tick(len(self.server.replicas.healthy()), dt)
        self.gate.resize(self.slots())
        for tenant in self.registry.expired(now):
            log.warning(
                "tenant %s (run %s): lease of %gs lapsed; unloading its adapters", tenant.id, tenant.run, tenant.lease_s
            )
            self.forget(tenant)
        if self._sweep is None or self._sweep.done():
            orphans = self.orphans()
            if orphans:
                self._sweep = asyncio.get_running_loop().create_task(self.unload(orphans))

    def forget(self, tenant: Tenant) -> None:
        """The tenant is gone: its token no longer passes, its waiting requests get 410, its share goes to the rest."""
        if self.registry.remove(tenant.id) is not None:
            self.gate.forget(tenant)

    def orphans(self) -> list[str]:
        """Adapters loaded through the proxy in the namespace of a tenant that is no longer registered."""
        tenants = self.registry.tenants
        return sorted(n for n in self.server.control.loaded if (t := tenant_of(n)) is not None and t not in tenants)

    async def unload(self, names: list[str]) -> list[str]:
        """Unload each of `names` still loaded from every replica (those out of rotation at re-admission)."""
        done = []
        for name in names:
            if name in self.server.control.loaded:
                await self.server.control.unload(name)
                done.append(name)
        return done

    def adapters(self, tenant_id: str) -> list[str]:
        return sorted(name for name in self.server.control.loaded if tenant_of(name) == tenant_id)

    # ------------------------------------------------------------------ rights on the admin routes
    def caller(self, request: web.Request) -> Tenant | None:
        return self.registry.who(request.headers.get("Authorization"))

    def broadcast_refusal(
        self, request: web.Request, denied: web.Response
    ) -> tuple[Tenant | None, web.Response | None]:
        """For a broadcast without the admin token: (the tenant, None) when its token may go on to the namespace check
        (adapter loads and unloads), else (None, the answer): 403 for a tenant, the admin 401 for anyone else."""
        tenant = self.caller(request)
        if tenant is None:
            return None, denied
        if request.path not in ADAPTER_PATHS:
            return None, _forbidden(f"{request.path[:100]}: {PAUSE_REFUSED}")
        return tenant, None

    @staticmethod
    def adapter_refusal(tenant: Tenant, path: str, body: bytes) -> web.Response | None:
        """403 when the tenant's load or unload names an adapter outside its namespace."""
        refusal = adapter_refusal(tenant, lora_name(body), ADAPTER_PATHS[path])
        return None if refusal is None else _forbidden(refusal)

    def admin_only(self, request: web.Request, denied: web.Response) -> web.Response:
        """A tenant's token on a fleet-wide admin route (replicas, vLLM's own admin calls): 403, not 401."""
        if self.caller(request) is not None:
            return _forbidden(f"{request.method} {request.path[:100]}: {PAUSE_REFUSED}")
        return denied

    def may_read(self, request: web.Request) -> bool:
        """A tenant may read what a replica tells (GET/HEAD: /server_info, /is_paused...), never post to it."""
        return request.method in ("GET", "HEAD") and self.caller(request) is not None

    # ------------------------------------------------------------------ routes
    async def register(self, request: web.Request) -> web.Response:
        denied = self.server.admin_denied(request)
        if denied is not None:
            return self.admin_only(request, denied)
        read = await self.server.read_body(request)
        if isinstance(read, web.Response):
            return read
        body, hold = read
        self.server.budget.release(hold)
        fields, problem = registration(body)
        if problem is not None:
            return json_error(400, f"POST /fleet/tenants: {problem}", "BadRequestError")
        try:
            tenant, token = self.registry.register(now=self._now(), wall=time.time(), **fields)
        except NoRoom as err:
            return json_error(409, f"this fleet cannot take run {fields['run']!r}: {err}", "Conflict")
        log.info(
            "tenant %s registered (run %s, lease %gs, %d versions)",
            tenant.id,
            tenant.run,
            tenant.lease_s,
            tenant.versions,
        )
        return web.json_response(
            {"tenant": tenant.id, "token": token, "prefix": f"{tenant.id}/", "lease_s": tenant.lease_s}
        )

    def _own(self, request: web.Request) -> Tenant | web.Response:
        """The tenant the path names, when the caller is it or the admin; else the answer (404 gone, 401, 403)."""
        tenant = self.registry.tenants.get(request.match_info["tenant"])
        if tenant is None:
            return _gone(request.match_info["tenant"])
        if self.server.admin.allows(request.headers.get("Authorization")):
            return tenant
        caller = self.caller(request)
        if caller is None:
            return self.server.admin_denied(request)
        if caller is not tenant:
            return _forbidden(f"tenant {caller.id} may act only on /fleet/tenants/{caller.id}, not on {tenant.id}")
        return tenant

    async def lease(self, request: web.Request) -> web.Response:
        tenant = self._own(request)
        if isinstance(tenant, web.Response):
            return tenant
        return web.json_response({"expires_in_s": self.registry.renew(tenant, self._now())})

    async def unregister(self, request: web.Request) -> web.Response:
        tenant = self._own(request)
        if isinstance(tenant, web.Response):
            return tenant
        self.forget(tenant)
        unloaded = await asyncio.shield(self.unload(self.adapters(tenant.id)))
        log.info("tenant %s unregistered; unloaded %s", tenant.id, unloaded or "nothing")
        return web.json_response({"unloaded": unloaded})

    async def show(self, request: web.Request) -> web.Response:
        tenant = self._own(request)
        if isinstance(tenant, web.Response):
            return tenant
        entry = {**tenant.entry(self.adapters(tenant.id), self._now()), "waiting": self.waiting(tenant)}
        return web.json_response({**entry, "fleet": self.totals()})  # the run's own figures stay its own

    async def list(self, request: web.Request) -> web.Response:
        denied = self.server.admin_denied(request)
        if denied is not None:
            return self.admin_only(request, denied)
        return web.json_response(self.summary())

    def totals(self) -> dict:
        """The fleet's replica-seconds (since start and idle) and its replicas in rotation now."""
        return {**self.registry.totals(), "replicas": len(self.server.replicas.healthy())}

    def summary(self) -> dict:
        now = self._now()
        tenants = [
            {**t.entry(self.adapters(t.id), now), "waiting": self.waiting(t)} for t in self.registry.tenants.values()
        ]
        return {"tenants": tenants, **self.totals()}

    def waiting(self, tenant: Tenant) -> int:
        return len(self.fair.waiting.get(tenant.id, ()))

    def stats(self) -> list[dict]:
        """The cheap per-tenant counters /proxy/stats carries. `waiting`: its requests held back by the fair share,
        demand that vLLM's own num_requests_waiting does not see (a fleet controller adds it)."""
        return [
            {
                "tenant": t.id,
                "in_flight": t.in_flight,
                "waiting": self.waiting(t),
                "requests": t.request_count,
                "tokens": t.tokens,
                "replica_seconds": round(t.replica_seconds, 3),
                "gate_wait_s": round(t.gate_wait_s(self._now()), 3),
            }
            for t in self.registry.tenants.values()
        ]
