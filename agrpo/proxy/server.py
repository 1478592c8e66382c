"""The aiohttp server that makes N vLLM replicas look like one.

Routed requests take a lean path: read the body once, extract the routing fields without
re-serialising anything, forward the same bytes over a pooled keep-alive connection, copy the
answer back (chunk by chunk for server-sent events). Everything else lives in
`control.py` (broadcasts, health, replica admin).
"""

import json
import logging
import os
from time import perf_counter

import aiohttp
from aiohttp import web

from agrpo.proxy.control import Control
from agrpo.proxy.metrics import Metrics
from agrpo.proxy.replicas import Replica, ReplicaSet
from agrpo.proxy.request_fields import BadRequest, parse_routing_fields
from agrpo.proxy.routing import Router
from agrpo.proxy.settings import ProxySettings
from agrpo.proxy.upstream import (
    TRANSPORT_ERRORS,
    describe_error,
    downstream_headers,
    json_error,
    upstream_headers,
)

log = logging.getLogger("agrpo.proxy")

ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions")
BROADCAST_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/pause", "/resume",
                   "/reset_prefix_cache", "/sleep", "/wake_up")


class ProxyServer:
    """One proxy. `await start()`, read `.url`, `await stop()`."""

    def __init__(self, settings: ProxySettings):
        problems = settings.problems()
        if problems:
            raise ValueError("invalid proxy settings: " + "; ".join(problems))
        self.settings = settings
        self.replicas = ReplicaSet(settings.upstreams)
        self.router = Router.from_settings(settings)
        self.metrics = Metrics()
        self.authorization = _authorization(settings.token_env)
        self.url: str | None = None
        self.session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=settings.total_timeout_s,
                                             connect=settings.connect_timeout_s)
        self.control = Control(self)
        self._runner: web.AppRunner | None = None
        self._next_any = 0

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
        app.router.add_route("*", "/{tail:.*}", self._any)
        return app

    async def start(self) -> None:
        """Bind, probe every replica once, then keep probing in the background."""
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            auto_decompress=False,
        )
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=self.settings.shutdown_timeout_s)
        try:
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.settings.host, self.settings.port, backlog=2048)
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            await self.session.close()
            raise
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
        await self.control.probe_all()
        self.control.start_probing()
        log.info("proxy on %s in front of %d replica(s)", self.url, len(self.replicas))

    async def stop(self) -> None:
        await self.control.stop_probing()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def __aenter__(self) -> "ProxyServer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ------------------------------------------------------------------ routed
    async def _routed(self, request: web.Request) -> web.StreamResponse:
        started = perf_counter()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.rejected += 1
            return json_error(413, f"request body exceeds {self.settings.max_body_bytes} bytes "
                                   "(--max-body-bytes)", "RequestTooLarge")
        try:
            fields = parse_routing_fields(raw)
        except BadRequest as err:
            self.metrics.rejected += 1
            return json_error(400, str(err), "BadRequestError")
        headers = upstream_headers(request.headers, self.authorization)
        path_qs = request.raw_path
        tried: set[int] = set()
        kind = None
        last_error, replica = "no replica is available", None
        for attempt in range(2):
            loads = self.replicas.loads(tried)
            if not loads:
                break
            decision = self.router.route(fields, loads)
            if kind is None:
                kind = decision.kind
                self.metrics.count_route(kind)
            else:
                self.metrics.retried += 1
            replica = self.replicas[decision.replica]
            tried.add(replica.index)
            retry_possible = attempt == 0 and bool(self.replicas.loads(tried))
            replica.begin(decision.work)
            try:
                try:
                    upstream = await self.session.request(
                        request.method, replica.target(path_qs), data=raw, headers=headers,
                        timeout=self.timeout)
                except TRANSPORT_ERRORS as err:
                    last_error = self.control.transport_failed(replica, err)
                    continue
                try:
                    if upstream.status >= 500:
                        self.control.error_status(replica, upstream.status)
                        if retry_possible:
                            last_error = f"replica {replica.index} answered {upstream.status}"
                            continue
                    else:
                        replica.consecutive_errors = 0
                    if upstream.content_type == "text/event-stream":
                        return await self._stream(request, upstream, replica, kind, started)
                    body = await upstream.read()
                except TRANSPORT_ERRORS as err:
                    last_error = self.control.transport_failed(replica, err)
                    continue
                finally:
                    upstream.release()
                self.metrics.observe_routed(kind, perf_counter() - started)
                return web.Response(body=body, status=upstream.status,
                                    headers=downstream_headers(upstream, replica))
            finally:
                replica.end(decision.work)
        self.metrics.failed += 1
        return json_error(502, f"no replica could serve the request: {last_error}",
                          "UpstreamError", replica)

    async def _stream(self, request, upstream, replica: Replica, kind, started):
        """Pass server-sent events through as they arrive; nothing is buffered."""
        response = web.StreamResponse(status=upstream.status,
                                      headers=downstream_headers(upstream, replica))
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except TRANSPORT_ERRORS as err:  # a replica or client dropped mid-stream: no retry now
            log.warning("stream from replica %d ended early: %s", replica.index,
                        describe_error(err))
        if kind is not None:
            self.metrics.observe_routed(kind, perf_counter() - started)
        return response

    # ------------------------------------------------------------------ one replica
    async def _any(self, request: web.Request) -> web.StreamResponse:
        """Anything else (/v1/models, /version, /tokenize...): one healthy replica answers."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return json_error(413, "request body too large (--max-body-bytes)", "RequestTooLarge")
        headers = upstream_headers(request.headers, self.authorization)
        last_error, replica = "no replica is available", None
        for replica in self._one_replica_order()[:2]:
            try:
                upstream = await self.session.request(
                    request.method, replica.target(request.raw_path), data=raw or None,
                    headers=headers, timeout=self.timeout)
            except TRANSPORT_ERRORS as err:
                last_error = self.control.transport_failed(replica, err)
                continue
            try:
                if upstream.content_type == "text/event-stream":
                    return await self._stream(request, upstream, replica, None, 0.0)
                body = await upstream.read()
            except TRANSPORT_ERRORS as err:
                last_error = self.control.transport_failed(replica, err)
                continue
            finally:
                upstream.release()
            body = self._rewrite(request.path, upstream.status, body)
            return web.Response(body=body, status=upstream.status,
                                headers=downstream_headers(upstream, replica))
        return json_error(502, f"no replica answered: {last_error}", "UpstreamError", replica)

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        return await self._any(request)

    def _one_replica_order(self) -> list[Replica]:
        healthy = self.replicas.healthy() or list(self.replicas)
        if not healthy:
            return []
        self._next_any = (self._next_any + 1) % len(healthy)
        return healthy[self._next_any:] + healthy[: self._next_any]

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
