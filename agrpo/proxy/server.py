"""The aiohttp server that makes N vLLM replicas look like one.

Routed requests take a lean path: read the body once, extract the routing fields without
re-serialising anything, forward the same bytes over a pooled keep-alive connection, copy the
answer back (chunk by chunk for server-sent events). Everything else lives in
`control.py` (broadcasts, health, replica admin).
"""

import asyncio
import json
import logging
import os
from time import perf_counter

import aiohttp
from aiohttp import web

from agrpo.proxy.control import Control
from agrpo.proxy.front import FrontProtocol, close_idle_forever
from agrpo.proxy.metrics import Metrics
from agrpo.proxy.pool import Exchange, Pool
from agrpo.proxy.replicas import Replica, ReplicaSet
from agrpo.proxy.routed import AiohttpSink, RoutedPath
from agrpo.proxy.routing import Router
from agrpo.proxy.tenant_routes import Tenancy
from agrpo.proxy.settings import (
    ProxySettings,
    canonical_url,
    is_loopback,
    may_receive_token,
    token_patterns,
    url_host,
)
from agrpo.proxy.trust import (
    EVICTED_MESSAGE,
    AdminGuard,
    BodyBudget,
    BodyEvicted,
    open_without_token,
    over_budget_message,
)
from agrpo.proxy.upstream import (
    TRANSPORT_ERRORS,
    OneLineLog,
    forwarded_head_lines,
    json_error,
    response_headers,
)

log = logging.getLogger("agrpo.proxy")

ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
BROADCAST_PATHS = (
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/pause",
    "/resume",
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
)


class ProxyServer:
    """One proxy. `await start()`, read `.url`, `await stop()`."""

    def __init__(self, settings: ProxySettings):
        problems = settings.problems()
        if problems:
            raise ValueError("invalid proxy settings: " + "; ".join(problems))
        self.settings = settings
        self.authorization = _authorization(settings.token_env)
        self.admin = AdminGuard.from_env(settings.admin_token_env)
        self._token_hosts = {url_host(canonical_url(url)) for url in settings.upstreams}
        self._token_patterns = token_patterns(settings)
        self.replicas = ReplicaSet([])
        for url in settings.upstreams:
            self.add_replica(url)
        self.router = Router.from_settings(settings)
        reserved = settings.max_inflight_body_bytes - settings.open_body_bytes()
        self.budget = BodyBudget(settings.max_inflight_body_bytes, reserved, settings.max_body_bytes_per_peer)
        self.metrics = Metrics(self.budget)
        self.pool = Pool(settings.connect_timeout_s)
        self.url: str | None = None
        self.session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=settings.total_timeout_s, connect=settings.connect_timeout_s)
        self.tenancy = Tenancy(self) if settings.tenancy else None  # one fleet, many runs (tenant_routes.py)
        self.control = Control(self)
        self.routed = RoutedPath(self)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self.front_connections: set = set()
        self._sweeper: asyncio.Task | None = None
        self._next_any = 0

    def add_replica(self, url: str, healthy: bool = True) -> Replica:
        """A new replica under its canonical URL (a valid one: settings.url_problems); it gets the upstream token only
        if its host may receive it."""
        url = canonical_url(url)
        replica = self.replicas.add(url, healthy=healthy)
        if self.authorization and may_receive_token(url_host(url), self._token_hosts, self._token_patterns):
            replica.authorization = self.authorization
        return replica

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        for path in ROUTED_PATHS:
            app.router.add_post(path, self._routed)
        for path in BROADCAST_PATHS:
            app.router.add_post(path, self.control.broadcast)
        app.router.add_get("/health", self.control.health)
        app.router.add_get("/proxy/stats", self.control.stats)
        app.router.add_get("/metrics", self.control.prometheus)
        app.router.add_post("/proxy/replicas", self.control.add_replica)
        app.router.add_delete("/proxy/replicas", self.control.remove_replica)
        app.router.add_get("/server_info", self._server_info)
        if self.tenancy is not None:
            self.tenancy.add_routes(app)
        app.router.add_route("*", "/{tail:.*}", self._any)
        return app

    async def start(self) -> None:
        """Bind, probe every replica once, then keep probing in the background."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            auto_decompress=False,
        )
        self._runner = web.AppRunner(
            self.build_app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.settings.shutdown_timeout_s,
            handler_cancellation=True,  # a client that leaves cancels its request (broadcasts are shielded)
            logger=OneLineLog(logging.getLogger("aiohttp.server")),  # a malformed request: one line, no traceback
        )
        try:
            await self._runner.setup()
            if self.settings.lean_front:  # routed requests skip aiohttp's server (front.py)
                self._listener = await asyncio.get_running_loop().create_server(
                    lambda: FrontProtocol(self), self.settings.host, self.settings.port, backlog=2048
                )
                host, port = self._listener.sockets[0].getsockname()[:2]
                sweep_s = min(10.0, self.settings.request_read_timeout_s / 4)
                self._sweeper = asyncio.get_running_loop().create_task(close_idle_forever(self, sweep_s))
            else:
                site = web.TCPSite(self._runner, self.settings.host, self.settings.port, backlog=2048)
                await site.start()
                host, port = self._runner.addresses[0][:2]
        except BaseException:
            await self._runner.cleanup()
            await self.session.close()
            raise
        self.url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        if not is_loopback(self.settings.host) and not self.admin.enabled:
            log.warning(
                "listening on %s (beyond loopback) without an admin token: anyone who "
                "can reach it may add or remove replicas, load adapters and pause "
                "generation; set --admin-token-env",
                self.settings.host,
            )
        await self.control.probe_all()
        self.control.start_probing()
        if self.tenancy is not None:
            self.tenancy.start()
        log.info("proxy on %s in front of %d replica(s)", self.url, len(self.replicas))

    def aiohttp_server(self):
        """A new aiohttp connection handler (the front hands connections over to it)."""
        return self._runner.server()

    async def stop(self) -> None:
        """Stop probing, let requests in flight finish (--shutdown-timeout-s), then close. The client session and the
        pool are closed whatever happened before (an unclosed session is an `Unclosed client session` error when the
        loop ends)."""
        try:
            await self.control.stop_probing()
            if self.tenancy is not None:
                await self.tenancy.stop()
            if self._sweeper is not None:
                self._sweeper.cancel()
                self._sweeper = None
            closing = []  # the front's connections and aiohttp's wait for their requests at the same time
            if self._listener is not None:
                self._listener.close()  # no new connections; requests in flight may finish
                closing += [front.close(self.settings.shutdown_timeout_s) for front in list(self.front_connections)]
                self._listener = None
            if self._runner is not None:
                closing.append(self._runner.cleanup())
                self._runner = None
            await asyncio.gather(*closing)
        finally:
            if self.session is not None:
                session, self.session = self.session, None
                await session.close()
            self.pool.close()

    async def __aenter__(self) -> "ProxyServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ------------------------------------------------------------------ requests in
    def admin_denied(self, request: web.Request) -> web.Response | None:
        """401 unless the request carries the admin token (None: it may go on)."""
        if self.admin.allows(request.headers.get("Authorization")):
            return None
        return json_error(
            401,
            f"{request.method} {request.path[:100]} needs 'Authorization: Bearer <admin token>' (the token in the "
            "variable named by --admin-token-env): without it only completions, chat completions, /tokenize, "
            "/detokenize and the reads /v1/models, /version, /ping, /health, /metrics and /proxy/stats are open",
            "Unauthorized",
            extra_headers={"WWW-Authenticate": "Bearer"},
        )

    @staticmethod
    def _absolute_form(request: web.Request) -> web.Response:
        return json_error(
            400,
            f"the request target must be a path (origin form, '/v1/...'), not {request.raw_path[:100]!r}",
            "BadRequestError",
        )

    def trusted(self, authorization: str | None) -> bool:
        """Whether a request carries the admin token or, with --tenancy, a run's token (its body then draws on the
        share others cannot hold: the runs of a shared fleet all come from one address)."""
        if self.admin.enabled and self.admin.allows(authorization):
            return True
        return self.tenancy is not None and self.tenancy.registry.who(authorization) is not None

    async def read_body(self, request: web.Request):
        """(body, its budget hold) or an error response: 413 over --max-body-bytes, 503 when the body budget has no
        room for it (trust.BodyBudget) or cut it off for a request that had arrived, 408 when the body does not
        arrive within --request-read-timeout-s. The budget counts bytes as they arrive, whatever Content-Length
        declares; the caller releases the hold (`budget.release`)."""
        limit = self.settings.max_body_bytes
        too_large = json_error(413, f"request body exceeds {limit} bytes (--max-body-bytes)", "RequestTooLarge")
        if request.content_length is not None and request.content_length > limit:
            return too_large
        content, loop = request.content, asyncio.get_running_loop()
        hold = self.budget.hold(
            request.remote, self.trusted(request.headers.get("Authorization")), evict=None, now=loop.time()
        )
        hold.evict = lambda: content.set_exception(BodyEvicted())
        parts = []

        async def arrive():
            async for chunk in content.iter_any():
                if hold.held + len(chunk) > limit:
                    return too_large
                complete = content.is_eof() or hold.held + len(chunk) == request.content_length
                if not self.budget.take(hold, len(chunk), complete, loop.time()):
                    return self._over_budget()
                parts.append(chunk)
            self.budget.take(hold, 0, True, loop.time())  # whole (a chunked body's end may come alone): not evictable
            return None

        try:
            refused = await asyncio.wait_for(arrive(), self.settings.request_read_timeout_s)
        except asyncio.TimeoutError:
            refused = json_error(
                408,
                f"the request body did not arrive within {self.settings.request_read_timeout_s:g}s "
                "(--request-read-timeout-s)",
                "RequestTimeout",
            )
        except BodyEvicted:
            refused = json_error(503, EVICTED_MESSAGE, "Overloaded", extra_headers={"Retry-After": "1"})
        except ConnectionError:  # the client left mid-body: nobody to answer, nothing to log but a line
            log.info("%s %s: the client left before its body arrived", request.method, request.path[:100])
            refused = json_error(400, "the connection closed before the body arrived", "BadRequestError")
        except BaseException:
            self.budget.release(hold)
            raise
        if refused is not None:
            self.budget.release(hold)
            refused.force_close()  # the rest of the body is not read
            return refused
        return b"".join(parts), hold

    def _over_budget(self) -> web.Response:
        return json_error(
            503,
            over_budget_message(self.settings.max_inflight_body_bytes),
            "Overloaded",
            extra_headers={"Retry-After": "1"},
        )

    # ------------------------------------------------------------------ routed
    async def _routed(self, request: web.Request) -> web.StreamResponse:
        """The routed path behind aiohttp (the lean front hands it what it does not take)."""
        started = perf_counter()
        if not request.raw_path.startswith("/"):
            return self._absolute_form(request)
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            self.metrics.rejected += 1
            return body
        raw, hold = body
        sink = AiohttpSink(request)
        try:
            await self.routed.handle(sink, request.method, request.raw_path, request.raw_headers, raw, started)
        finally:
            self.budget.release(hold)
        return sink.response

    # ------------------------------------------------------------------ one replica
    async def _any(self, request: web.Request) -> web.StreamResponse:
        """Anything else (/v1/models, /version, /tokenize...): one healthy replica answers.

        Only the reads and posts of trust.open_without_token are open; everything else (vLLM's informational and
        dev endpoints included) needs the admin token like the broadcasts do, checked before any body byte is read.
        """
        if not request.raw_path.startswith("/"):
            return self._absolute_form(request)
        if not open_without_token(request.method, request.path):
            denied = self.admin_denied(request)
            if denied is not None and self.tenancy is not None:  # a run's token reads, never posts
                denied = None if self.tenancy.may_read(request) else self.tenancy.admin_only(request, denied)
            if denied is not None:
                return denied
        body = await self.read_body(request)
        if isinstance(body, web.Response):
            return body
        raw, hold = body
        try:
            return await self._one_replica(request, raw)
        finally:
            self.budget.release(hold)

    async def _one_replica(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        head_lines = forwarded_head_lines(request.raw_headers)
        last_error, replica = "no replica is available", None
        for replica in self._one_replica_order()[:2]:
            exchange = Exchange(self.pool, replica, self.settings.total_timeout_s)
            try:
                upstream = await exchange.send(request.method, request.raw_path, head_lines, raw)
                if upstream.content_type == "text/event-stream":
                    sink = AiohttpSink(request)
                    await self.routed.stream(sink, exchange, upstream, replica, None, 0.0)
                    return sink.response
                body = await upstream.read()
            except TRANSPORT_ERRORS as err:
                last_error = self.control.transport_failed(replica, err)
                continue
            finally:
                exchange.finish()
            body = self._rewrite(request.path, upstream.status, body)
            return web.Response(body=body, status=upstream.status, headers=response_headers(upstream.headers, replica))
        return json_error(502, f"no replica answered: {last_error}", "UpstreamError", replica)

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        return await self._any(request)

    def _one_replica_order(self) -> list[Replica]:
        healthy = self.replicas.healthy() or list(self.replicas)
        if not healthy:
            return []
        self._next_any = (self._next_any + 1) % len(healthy)
        return healthy[self._next_any :] + healthy[: self._next_any]

    @staticmethod
    def _rewrite(path: str, status: int, body: bytes) -> bytes:
        """/server_info claims data_parallel_size 1: TRL then keeps adapter-only sync."""
        if path != "/server_info" or status != 200:
            return body
        try:
            info = json.loads(body)
        except ValueError:
            return body
        _single_engine(info)
        return json.dumps(info).encode()


def _single_engine(node) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data_parallel_size" and isinstance(value, int):
                node[key] = 1
            else:
                _single_engine(value)
    elif isinstance(node, list):
        for value in node:
            _single_engine(value)


def _authorization(token_env: str | None) -> str | None:
    if not token_env:
        return None
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise ValueError(f"--token-env {token_env}: that environment variable is empty or unset")
    return f"Bearer {token}"
