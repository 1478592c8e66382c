"""The routed hot path, independent of which HTTP server received the request.

`RoutedPath.handle` parses the routing fields, picks a replica, forwards the untouched body over
the pooled client, retries once on another replica, and hands the answer to a *sink*: the
aiohttp handler's (`AiohttpSink`) or the lean front's (`front.RawSink`). A sink has
`respond(status, headers, body)` for a buffered answer and `start_stream` / `write` /
`end_stream` / `abort_stream` for server-sent events.
"""

import json
import logging
from time import perf_counter

from aiohttp import web

from agrpo.proxy.deadline import Deadlines, late_replicas
from agrpo.proxy.pool import Exchange
from agrpo.proxy.replicas import Replica
from agrpo.proxy.request_fields import BadRequest, parse_routing_fields
from agrpo.proxy.retired import retired_body
from agrpo.proxy.stale_abort import StaleSweep, abort_retired
from agrpo.proxy.tenant_gate import StreamCount
from agrpo.proxy.upstream import (
    REPLICA_HEADER,
    TRANSPORT_ERRORS,
    describe_error,
    error_body,
    forwarded_head_lines,
    response_headers,
)

log = logging.getLogger("agrpo.proxy")

JSON = [("Content-Type", "application/json")]
RETRY_ELSEWHERE = frozenset((502, 503, 504))  # a gateway or an engine saying "not now", not "this request is wrong"


def error_headers(replica: Replica | None, extra: dict | None = None) -> list:
    headers = JSON + list((extra or {}).items())
    if replica is not None:
        headers.append((REPLICA_HEADER, str(replica.index)))
    return headers


def cut_event(problem: str) -> bytes:
    """The SSE event a client gets when a replica's stream was cut short."""
    event = json.dumps(
        {"error": {"message": f"the replica's stream was cut short: {problem}", "type": "UpstreamError", "code": 502}}
    )
    return f"event: error\ndata: {event}\n\n".encode()


class AiohttpSink:
    """Answers through aiohttp: `response` is what the handler returns."""

    __slots__ = ("request", "response", "streaming")

    def __init__(self, request: web.Request):
        self.request = request
        self.response: web.StreamResponse | None = None
        self.streaming = False

    async def respond(self, status: int, headers, body: bytes) -> None:
        self.response = web.Response(body=body, status=status, headers=headers)

    async def start_stream(self, status: int, headers) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        self.streaming = True
        await self.response.prepare(self.request)

    async def write(self, chunk: bytes) -> None:
        await self.response.write(chunk)

    async def end_stream(self) -> None:
        await self.response.write_eof()

    async def abort_stream(self, event: bytes) -> None:
        try:
            await self.response.write(event)
        except TRANSPORT_ERRORS:
            pass
        if self.request.transport is not None:
            self.request.transport.abort()


class RoutedPath:
    """Routing, forwarding and retries for /v1/completions and /v1/chat/completions."""

    def __init__(self, server):
        self.server = server
        self.replicas = server.replicas
        self.router = server.router
        self.metrics = server.metrics
        self.pool = server.pool
        self.control = server.control
        self.timeout_s = server.settings.total_timeout_s
        self.tenancy = None if server.tenancy is None else server.tenancy.gate  # --tenancy only (tenant_gate.py)
        self.sweep = StaleSweep()  # aborts requests whose version was retired while they ran (stale_abort.py)
        self.deadlines = Deadlines()  # how long an answer has until it is too late to train (deadline.py)

    async def handle(self, sink, method: str, path_qs: str, raw_headers, raw: bytes, started: float) -> None:
        try:
            await self._route(sink, method, path_qs, raw_headers, raw, started)
        except TRANSPORT_ERRORS:
            return  # the client left while its answer was being written: no one to tell
        except Exception as err:  # never a bare 500 or a traceback to the client
            log.exception("routed request failed inside the proxy")
            self.metrics.failed += 1
            problem = f"proxy error: {describe_error(err)}"
            if sink.streaming:
                await sink.abort_stream(cut_event(problem))
            else:
                await sink.respond(500, JSON, error_body(500, problem))

    async def _route(self, sink, method, path_qs, raw_headers, raw, started) -> None:
        metrics = self.metrics
        try:
            fields = parse_routing_fields(raw)
        except BadRequest as err:
            metrics.rejected += 1
            await sink.respond(400, JSON, error_body(400, str(err), "BadRequestError"))
            return
        if self.tenancy is None:
            await self._forward(sink, method, path_qs, raw_headers, raw, started, fields, None)
            return
        tenant, go = await self.tenancy.enter(sink, raw_headers, fields.model, fields.n)  # may wait: fair share
        if not go:
            return
        try:
            await self._forward(sink, method, path_qs, raw_headers, raw, started, fields, tenant)
        finally:
            if tenant is not None:
                self.tenancy.leave(tenant, fields.n)

    async def _forward(self, sink, method, path_qs, raw_headers, raw, started, fields, tenant) -> None:
        metrics = self.metrics
        head_lines = forwarded_head_lines(raw_headers)
        self.deadlines.seen(fields.model, started)
        if self.sweep.due(started):
            abort_retired(self.replicas, self.control.retired)
            self.deadlines.sweep(self.control.retired, started)
        left = self.deadlines.time_left(fields.model, started)
        tried: set[int] = set()
        # the first attempt's routing kind, whether an adapter was reloaded, the replicas tried
        state = {"kind": None, "reloaded": False, "tried": tried}
        last_error, replica = "no replica is available", None
        for attempt in range(2):
            if fields.model in self.control.retired:  # before the first try and before a failover
                await self._retired(sink, fields.model)
                return
            loads = self.replicas.loads(tried, fields.model)
            if not loads:
                break
            late = late_replicas(loads, self.replicas, left, perf_counter())  # would answer too late
            decision = self.router.route(fields, loads, self.replicas.paces(loads), late)
            if state["kind"] is None:
                state["kind"] = decision.kind
                metrics.count_route(decision.kind)
            else:
                metrics.retried += 1
            replica = self.replicas[decision.replica]
            tried.add(replica.index)
            request = (method, path_qs, head_lines, raw)
            done, problem = await self._attempt(
                sink, attempt, request, started, fields, tenant, replica, decision, state
            )
            if done:
                return
            last_error = problem
        metrics.failed += 1
        await sink.respond(
            502,
            error_headers(replica),
            error_body(502, f"no replica could serve the request: {last_error}", "UpstreamError"),
        )

    async def _attempt(
        self, sink, attempt, request, started, fields, tenant, replica, decision, state
    ) -> tuple[bool, str]:
        """One try on `replica`: (True, "") when the client was answered, else (False, why) to try elsewhere."""
        work, kind, tried = decision.work, state["kind"], state["tried"]
        begun = perf_counter()
        replica.begin(work, begun)
        exchange = Exchange(self.pool, replica, self.timeout_s, fields.model)
        answered = False
        try:
            try:
                upstream = await exchange.send(*request)
                body = None
                if upstream.status == 404 and self.tenancy is not None and not state["reloaded"]:
                    exchange, upstream, body = await self._reloaded(exchange, upstream, fields.model, request)
                    state["reloaded"] = body is None
                # An answer is never the replica's health (probes and connection failures are): a 500 is this
                # request's problem and goes back as it is. "Not now" statuses get one try elsewhere.
                if upstream.status in RETRY_ELSEWHERE and attempt == 0 and self.replicas.loads(tried, fields.model):
                    return False, f"replica {replica.index} answered {upstream.status}"
                answered = upstream.status < 400
                if upstream.content_type == "text/event-stream":
                    counter = None if tenant is None else StreamCount(tenant)
                    await self.stream(sink, exchange, upstream, replica, kind, started, counter)
                    self._note_late(replica, fields.model, answered)
                    return True, ""
                if body is None:
                    body = await upstream.read()
            except TRANSPORT_ERRORS as err:
                answered = False
                if exchange.retired:  # aborted by the proxy (stale_abort.py): the replica did nothing wrong
                    await self._retired(sink, fields.model)
                    return True, ""
                return False, self.control.transport_failed(replica, err)
            if tenant is not None:
                self.tenancy.count(tenant, body)
            self._note_late(replica, fields.model, answered)
            self.metrics.observe_routed(kind, perf_counter() - started)
            await sink.respond(upstream.status, response_headers(upstream.headers, replica), body)
            return True, ""
        finally:
            exchange.finish()
            now = perf_counter()
            replica.end(work, now, answered, now - begun)

    async def _retired(self, sink, model: str) -> None:
        self.metrics.retired += 1
        await sink.respond(410, JSON, retired_body(model))

    def _note_late(self, replica: Replica, model: str, answered: bool) -> None:
        """An answer that came back after its version was retired is certainly dropped as stale: counted on the
        replica that was too slow (its share of the dropped samples, as the proxy sees them)."""
        if answered and model in self.control.retired:
            replica.late += 1
            self.metrics.late += 1

    async def _reloaded(self, exchange, upstream, model: str, again: tuple):
        """(exchange, answer, its body) after a 404: when the replica lost adapter `model` that the proxy loaded, the
        adapter is reloaded there and the request sent again (body None: not read yet); else the 404 as it was."""
        body = await upstream.read()
        replica = exchange.replica
        if not await self.tenancy.reload_evicted(replica, model, body):
            return exchange, upstream, body
        exchange.finish()
        exchange = Exchange(self.pool, replica, self.timeout_s, model)
        return exchange, await exchange.send(*again), None

    async def stream(self, sink, exchange, upstream, replica: Replica, kind, started, counter=None) -> None:
        """Pass server-sent events through as they arrive; nothing is buffered.

        A stream the replica cuts short (it died, the connection dropped, or a completion
        stream ended without vLLM's closing `data: [DONE]`) must not look like a normal end:
        the client gets an SSE `error` event and then an aborted connection.
        """
        await sink.start_stream(upstream.status, response_headers(upstream.headers, replica))
        tail = b""
        problem = None
        chunks = upstream.iter_chunks()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except TRANSPORT_ERRORS as err:
                problem = describe_error(err)
                break
            try:
                await sink.write(chunk)
            except TRANSPORT_ERRORS:  # the client left; the replica's answer is dropped
                exchange.abort()
                return
            tail = (tail + chunk)[-32:]
            if counter is not None:
                counter.feed(chunk)
        if problem is None and b"[DONE]" not in tail and kind is not None:
            problem = "the stream ended without vLLM's closing DONE event"
        if problem is not None:
            log.warning("stream from replica %d cut short: %s", replica.index, problem)
            self.metrics.stream_cuts += 1
            exchange.abort()
            await sink.abort_stream(cut_event(problem))
            return
        await sink.end_stream()
        if counter is not None:
            counter.done()
        if kind is not None:
            self.metrics.observe_routed(kind, perf_counter() - started)
