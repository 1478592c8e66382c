"""The proxy's control plane: broadcasts, health, stats, and replicas joining or leaving.

State changes are serialised by one lock and remembered (loaded adapters, pause), so a replica
that comes back or is added at runtime first receives the same state as the others and only
then takes traffic.
"""

import asyncio
import json
import logging
import math
from time import perf_counter

import aiohttp
from aiohttp import web

from agrpo.proxy import availability, broadcast
from agrpo.proxy.admin_requests import lora_name, query_value, replica_url_from
from agrpo.proxy.broadcast import LoadRetry, Outcome, Reply
from agrpo.proxy.health import ReplicaHealth
from agrpo.proxy.replicas import Replica
from agrpo.proxy.retired import RecentNames
from agrpo.proxy.upstream import (
    describe_error,
    json_error,
    send_once,
)

log = logging.getLogger("agrpo.proxy")


class Control(ReplicaHealth):
    """Handlers and background work that are not on the routed hot path (health and re-admission: health.py)."""

    def __init__(self, server):
        self.server = server
        self.settings = server.settings
        self.replicas = server.replicas
        self.metrics = server.metrics
        self.retry = LoadRetry(
            self.settings.load_retry_deadline_s, self.settings.load_retry_initial_s, self.settings.load_retry_max_s
        )
        self.loaded: dict[str, bytes] = {}  # adapter name -> its load body, replayed on (re)admission
        self.unloaded: set[str] = set()  # routing state to forget at the next successful load
        self.retired = RecentNames()  # unloaded by a client: requests naming one get 410 (retired.py)
        self.owed: dict[int, dict[str, float]] = {}  # replica -> {failed load it did not answer: give up at}
        self.paused_qs: str | None = None
        self.generation = 0  # bumped by every state change; an admission replays until stable
        self._lock = asyncio.Lock()
        self._probe_task: asyncio.Task | None = None
        self._probes: dict[int, asyncio.Task] = {}  # each replica's probe in progress (health.py)
        self._loading: set[asyncio.Task] = set()  # serve=first loads still running on slower replicas
        self._broadcast_timeout = aiohttp.ClientTimeout(
            total=self.settings.broadcast_timeout_s, connect=self.settings.connect_timeout_s
        )
        self._send_unless_down = broadcast.abandoned_when_down(self._send_once)
        # no rounding up to a whole second (aiohttp's default from 5 s on): the probe's timeout is the hung-replica bound
        self._probe_timeout = aiohttp.ClientTimeout(total=self.settings.health_timeout_s, ceil_threshold=math.inf)
        self._headers = {"Content-Type": "application/json"}  # + the token where allowed

    # ------------------------------------------------------------------ broadcast
    async def _send_once(self, replica: Replica, method: str, path_qs: str, body: bytes) -> Reply:
        return await send_once(
            self.server.session, replica, method, path_qs, body, self._headers, self._broadcast_timeout
        )

    async def _send(self, replica: Replica, method: str, path_qs: str, body: bytes) -> Reply:
        """One broadcast message; given up on at once if the replica is marked unhealthy meanwhile."""
        reply = await self._send_unless_down(replica, method, path_qs, body)
        if reply.status is None and replica.healthy:  # down: out of rotation until a probe re-admits it
            self.mark_unhealthy(replica, f"no answer to {path_qs} ({reply.error})", hung=reply.error == "timed out")
        return reply

    async def broadcast(self, request: web.Request) -> web.Response:
        denied, tenant, tenancy = self.server.admin_denied(request), None, self.server.tenancy
        if denied is not None and tenancy is not None:  # a run's token: its own adapters only (tenant_routes.py)
            tenant, denied = tenancy.broadcast_refusal(request, denied)
        if denied is not None:
            return denied
        if not request.raw_path.startswith("/"):
            return self.server._absolute_form(request)
        read = await self.server.read_body(request)
        if isinstance(read, web.Response):
            return read
        body, held = read
        path, path_qs = request.path, request.raw_path
        refused = None if tenant is None else tenancy.adapter_refusal(tenant, path, body)
        if refused is not None:
            self.server.budget.release(held)
            return refused
        started = perf_counter()
        try:  # shielded: a client that leaves must not stop a state change half-way (all-or-nothing)
            outcome = await asyncio.shield(self._locked_apply(path, path_qs, body))
        finally:
            self.server.budget.release(held)
        self.metrics.observe_broadcast(path.rsplit("/", 1)[-1], outcome.ok, perf_counter() - started)
        if not outcome.ok:
            log.warning("%s -> %d: %s", path, outcome.status, outcome.body[:500])
        return web.Response(status=outcome.status, body=outcome.body, content_type=outcome.content_type.split(";")[0])

    async def unload(self, name: str) -> Outcome:
        """Unload adapter `name` from every replica, as a client's broadcast would (a tenant that left)."""
        started, path = perf_counter(), "/v1/unload_lora_adapter"
        outcome = await self._locked_apply(path, path, json.dumps({"lora_name": name}).encode())
        self.metrics.observe_broadcast("unload_lora_adapter", outcome.ok, perf_counter() - started)
        if not outcome.ok:
            log.warning("unloading %s -> %d: %s", name, outcome.status, outcome.body[:500])
        return outcome

    async def _locked_apply(self, path: str, path_qs: str, body: bytes) -> Outcome:
        try:
            async with self._lock:
                self.generation += 1  # before and after: an admission that read the state
                try:  # while this ran sees a change either way and replays again
                    return await self._apply(path, path_qs, body)
                finally:
                    self.generation += 1
        except Exception as err:  # never a traceback to the client
            log.exception("broadcast %s failed", path)
            return broadcast.error_outcome(500, f"proxy error during {path}: {describe_error(err)}")

    async def _apply(self, path: str, path_qs: str, body: bytes) -> Outcome:
        targets = self.replicas.healthy()
        if path == "/v1/load_lora_adapter":
            name = lora_name(body)
            if name is None:
                return broadcast.error_outcome(
                    400, "load_lora_adapter needs a JSON body with a string 'lora_name'", "BadRequestError"
                )
            if query_value(path_qs, "serve") == availability.SERVE_FIRST:
                return await self._load_first(targets, name, body)
            outcome = await broadcast.load_adapter(targets, body, self._send, self.retry)
            if not outcome.ok:
                give_up = asyncio.get_running_loop().time() + self.settings.broadcast_timeout_s
                for index in outcome.silent:  # its load may land late: undone before it serves again
                    self.owed.setdefault(index, {})[name] = give_up
            else:
                for replica in targets:
                    if replica.healthy:
                        replica.adapters.add(name)
                self._loaded(name, body, f"loaded on {len(targets)} replica(s)")
            return outcome
        if path == "/v1/unload_lora_adapter":
            name = lora_name(body)
            if name is not None:  # retired first: a request arriving while replicas unload gets 410, not a 404
                self.retired.add(name)
            if name in self.replicas.adapters:  # only where it is loaded: the others have nothing to unload
                targets = [r for r in targets if name in r.adapters]
            outcome = await broadcast.unload_adapter(targets, body, self._send)
            if name is not None:
                self.loaded.pop(name, None)
                self.unloaded.add(name)
                self.replicas.adapters.discard(name)
                for replica in self.replicas:
                    replica.adapters.discard(name)
            return outcome
        if path == "/pause":
            outcome = await broadcast.everywhere_or_undo(targets, path_qs, body, self._send, "/resume")
            if outcome.ok:
                self.paused_qs = path_qs
            return outcome
        if path == "/resume":
            outcome = await broadcast.everywhere_or_undo(
                targets, path_qs, body, self._send, self.paused_qs or "/pause?mode=keep"
            )
            if outcome.ok:
                self.paused_qs = None
            return outcome
        return await broadcast.everywhere(targets, "POST", path_qs, body, self._send)

    def _loaded(self, name: str, body: bytes, where: str) -> None:
        self.retired.discard(name)
        for owed in self.owed.values():
            owed.pop(name, None)
        self.loaded[name] = body
        self.replicas.adapters.add(name)
        forgotten = self.server.router.forget_adapters(self.unloaded | {name})
        log.info(
            "adapter %s %s; forgot %d routing entries of %s", name, where, forgotten, sorted(self.unloaded) or "none"
        )
        self.unloaded.clear()

    async def _load_first(self, targets: list[Replica], name: str, body: bytes) -> Outcome:
        """`?serve=first`: answer once one replica serves the adapter; the others load on (availability.py)."""
        first = [True]

        async def served(replica: Replica) -> None:
            if first[0]:
                first[0] = False
                replica.adapters.add(name)
                self._loaded(name, body, f"served by replica {replica.index} (first of {len(targets)})")
            elif name in self.loaded:
                replica.adapters.add(name)
            else:  # unloaded while this replica was still loading it: undo it here too
                await self._send(replica, "POST", "/v1/unload_lora_adapter", json.dumps({"lora_name": name}).encode())

        def failed(replica: Replica, reply: Reply) -> None:
            if reply.status is None:
                return  # no answer: already out of rotation (_send), re-admitted with a replay
            replica.mark_down(f"could not load adapter {name}: {reply.summary()}", False, self._now())
            log.warning("replica %d (%s) out of rotation: %s", replica.index, replica.url, replica.last_error)

        def done() -> None:
            if name not in self.loaded:  # unloaded before the slowest load ended: served() undid those loads
                return
            holders = sum(1 for r in self.replicas if name in r.adapters)
            log.info("adapter %s loaded on %d replica(s)", name, holders)

        return await availability.load_first(
            targets,
            name,
            body,
            self._send,
            self.retry,
            on_served=served,
            on_failed=failed,
            on_done=done,
            tasks=self._loading,
        )

    async def health(self, request: web.Request) -> web.Response:
        total = len(self.replicas)
        healthy = len(self.replicas.healthy())
        needed = self.settings.health_quorum or total
        ok = total > 0 and healthy >= needed
        body = {"status": "ok" if ok else "unhealthy", "healthy": healthy, "replicas": total, "needed": needed}
        return web.json_response(body, status=200 if ok else 503)

    # ------------------------------------------------------------------ stats
    async def stats(self, request: web.Request) -> web.Response:
        stats = self.metrics.stats(self.replicas, self.server.router.tracked)
        if self.server.tenancy is not None:  # --tenancy: each run's share, counters only (no names, no tokens)
            stats["tenants"] = self.server.tenancy.stats()
        return web.json_response(stats)

    async def prometheus(self, request: web.Request) -> web.Response:
        text = self.metrics.prometheus(self.replicas, self.server.router.tracked)
        return web.Response(
            text=text, content_type="text/plain", charset="utf-8", headers={"X-Content-Type-Options": "nosniff"}
        )

    # ------------------------------------------------------------------ replicas
    async def add_replica(self, request: web.Request) -> web.Response:
        denied = self.server.admin_denied(request)
        if denied is not None:
            return denied if self.server.tenancy is None else self.server.tenancy.admin_only(request, denied)
        url = await replica_url_from(request, self.server)
        if isinstance(url, web.Response):
            return url
        if self.replicas.find(url) is not None:
            return json_error(409, f"replica {url} is already behind the proxy", "Conflict")
        replica = self.server.add_replica(url, healthy=False)
        await asyncio.shield(self.probe(replica))  # synchronises adapters and pause state, then admits
        log.info("replica %d (%s) added (healthy=%s)", replica.index, replica.url, replica.healthy)
        return web.json_response(replica.describe(), status=201)

    async def remove_replica(self, request: web.Request) -> web.Response:
        denied = self.server.admin_denied(request)
        if denied is not None:
            return denied if self.server.tenancy is None else self.server.tenancy.admin_only(request, denied)
        url = await replica_url_from(request, self.server)
        if isinstance(url, web.Response):
            return url
        replica = self.replicas.remove(url)
        if replica is None:
            return json_error(404, f"replica {url} is not behind the proxy", "NotFoundError")
        log.info("replica %d (%s) removed", replica.index, replica.url)
        return web.json_response(replica.describe())
