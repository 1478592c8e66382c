"""The lean front: a raw HTTP/1.1 protocol that serves the routed path itself.

Every client connection starts here. A `POST /v1/completions` or `/v1/chat/completions`
(HTTP/1.1, Content-Length body, nothing unusual) is parsed with a few byte operations and
handed to `RoutedPath` with a `RawSink` that writes the answer straight to the socket. The
first request that is anything else (another path, a chunked upload, `Expect`, an absolute-form
target, a body over the limits...) hands the whole connection, with the bytes already received,
to aiohttp's server, which then serves it to the end with every check it has. aiohttp's server
costs about as much CPU per request as the rest of the proxy together; this path skips it.

Abuse it must survive: a body counts against the shared body budget only as its bytes arrive (a
head that declares 64 MiB holds nothing), within the shares trust.BodyBudget gives requests without
the admin token and each client address, and a body that stalls gives its bytes up to one that
arrived (so a few connections withholding their last byte starve nobody); a request must arrive whole within
--request-read-timeout-s (else 408); a client that pipelines requests without reading the
answers is not read from until it does; a client that leaves cancels its request upstream; a
head with a bare LF gets 400 at once.
"""

import asyncio
import re
from http import HTTPStatus
from time import perf_counter

from agrpo.proxy.trust import EVICTED_MESSAGE, over_budget_message
from agrpo.proxy.upstream import TRANSPORT_ERRORS, error_body

_ROUTED = {b"/v1/completions": "/v1/completions", b"/v1/chat/completions": "/v1/chat/completions"}
_MAX_HEAD = 65536
IDLE_CLOSE_S = 75.0  # like aiohttp's keep-alive: a connection silent this long is closed
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # in a head without its CRLFs: refused
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110)
_BARE_LF = re.compile(rb"(?<!\r)\n")  # a head line ended by LF alone: never a valid HTTP/1.1 head


class RawSink:
    """Writes an answer as HTTP/1.1 bytes on the front connection."""

    __slots__ = ("front", "streaming")

    def __init__(self, front: "FrontProtocol"):
        self.front = front
        self.streaming = False

    def _head(self, status: int, headers, framing: bytes) -> bytes:
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        for name, value in headers:
            lines.append(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape"))
        lines.append(framing)
        if self.front.closing:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    async def respond(self, status: int, headers, body: bytes) -> None:
        head = self._head(status, headers, b"Content-Length: %d\r\n" % len(body))
        if len(body) < 65536:
            self.front.send(head + body)  # one write, one segment
        else:
            self.front.send(head)
            self.front.send(body)

    async def start_stream(self, status: int, headers) -> None:
        self.streaming = True
        self.front.send(self._head(status, headers, b"Transfer-Encoding: chunked\r\n"))

    async def write(self, chunk: bytes) -> None:
        if chunk:
            self.front.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            await self.front.drain()

    async def end_stream(self) -> None:
        self.front.send(b"0\r\n\r\n")

    async def abort_stream(self, event: bytes) -> None:
        try:
            await self.write(event)
        except TRANSPORT_ERRORS:
            pass
        self.front.abort()


class FrontProtocol(asyncio.Protocol):
    """One client connection; requests are served one at a time, in order."""

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.buffer = bytearray()
        self.busy = False
        self.closing = False
        self.handed_over = False
        self._paused = False
        self._drain: asyncio.Future | None = None
        self._task: asyncio.Task | None = None
        self._pending = None  # [path, length, headers, budget hold] of a body still arriving
        # that body's bytes so far, as received: joined once when whole (growing one buffer to 64 MiB copied it ~9
        # times over, which made a client resending large bodies slow everyone else's requests)
        self._parts: list[bytes] = []
        self._parts_len = 0
        self.peer = ""  # the client's address: the body budget's per-peer share
        self._loop = None
        self.last_active = 0.0
        self.reading_since: float | None = None  # when the request being read began to arrive (None: none is)

    # -- asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self.last_active = self._loop.time()
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.server.front_connections.add(self)

    def connection_lost(self, exc):
        self.server.front_connections.discard(self)
        self.closing = True
        self._release_pending()  # a body that will never complete
        if self._task is not None and not self._task.done():
            # nobody waits for the answer (a client that half-closes counts as gone, as nginx has it by
            # default): stop the request upstream too, so the replica stops generating for nobody
            self._task.cancel()
        self._wake()

    def data_received(self, data):
        self.last_active = now = self._loop.time()
        if self._pending is not None:
            self._parts.append(data)
            self._parts_len += len(data)
        else:
            self.buffer += data
        if not self.busy:
            if self.reading_since is None:
                self.reading_since = now
            self._next()
        elif len(self.buffer) > _MAX_HEAD:
            self.transport.pause_reading()  # a client racing ahead of its answers waits

    def pause_writing(self):
        self._paused = True

    def resume_writing(self):
        self._paused = False
        self._wake()

    # -- writing
    def send(self, data: bytes) -> None:
        transport = self.transport
        if transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        transport.write(data)

    async def drain(self) -> None:
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self._paused:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def _wake(self) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def abort(self) -> None:
        self.closing = True
        self.transport.abort()

    def refuse(self, status: int, message: str, kind: str, extra_headers=()) -> None:
        """Answer the request being read with an error and close the connection (its body is not read)."""
        self._release_pending()
        self.closing = True
        self.buffer.clear()
        self.server.metrics.rejected += 1
        body = error_body(status, message, kind)
        headers = [("Content-Type", "application/json"), *extra_headers]
        if not self.transport.is_closing():
            self.transport.write(RawSink(self)._head(status, headers, b"Content-Length: %d\r\n" % len(body)) + body)
            self.transport.close()

    def _release_pending(self) -> None:
        pending, self._pending = self._pending, None
        self._parts, self._parts_len = [], 0
        if pending is not None:
            self.server.budget.release(pending[3])

    def _evicted(self) -> None:
        """The budget took this body's bytes back for a request that had arrived (trust.BodyBudget)."""
        self.refuse(503, EVICTED_MESSAGE, "Overloaded", [("Retry-After", "1")])

    # -- requests
    def _next(self) -> None:
        buffer = self.buffer
        if self._pending is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if _BARE_LF.search(buffer):
                    self.refuse(400, "request head lines must end with CRLF, not a bare LF", "BadRequestError")
                elif len(buffer) > _MAX_HEAD:
                    self._hand_over()
                return
            request = self._lean_request(bytes(buffer[:end]))
            if request is None:
                self._hand_over()
                return
            path, length, headers, authorization = request
            if length > self.server.settings.max_body_bytes:
                self._hand_over()  # aiohttp answers 413 without reading the body
                return
            trusted = self.server.trusted(authorization)  # the token is checked before any body byte counts
            hold = self.server.budget.hold(self.peer, trusted, self._evicted, self._loop.time())
            self._pending = [path, length, headers, hold]
            body = bytes(buffer[end + 4 :])
            buffer.clear()
            self._parts, self._parts_len = [body] if body else [], len(body)
        path, length, headers, hold = self._pending
        arrived = min(self._parts_len, length)
        if arrived > hold.held:  # the budget counts body bytes as they arrive, never what a head declares
            if not self.server.budget.take(hold, arrived - hold.held, arrived == length, self._loop.time()):
                limit = self.server.settings.max_inflight_body_bytes
                self.refuse(503, over_budget_message(limit), "Overloaded", [("Retry-After", "1")])
                return
        if arrived < length:
            return
        self._pending = None
        raw = b"".join(self._parts)
        self._parts, self._parts_len = [], 0
        if len(raw) > length:  # the start of a pipelined request
            buffer += raw[length:]
            raw = raw[:length]
        self.busy = True
        self.reading_since = None
        self._task = self._loop.create_task(self._serve(path, headers, raw, hold))

    def _lean_request(self, head: bytes):
        """(path, content length, raw header pairs, Authorization value) when the lean path may serve it, else None.

        Anything a strict parser would question (bare CR or LF, control bytes, odd header
        names, a repeated Content-Length, Transfer-Encoding) is left to aiohttp's parser, so
        nothing ambiguous is ever forwarded to a replica.
        """
        if _CONTROL.search(head.replace(b"\r\n", b"")):
            return None
        line_end = head.find(b"\r\n")
        request_line = head if line_end < 0 else head[:line_end]
        parts = request_line.split(b" ")
        if len(parts) != 3 or parts[0] != b"POST" or parts[2] != b"HTTP/1.1":
            return None
        path = _ROUTED.get(parts[1])
        if path is None:
            return None
        length, authorization = None, None
        headers = []
        for line in head[line_end + 2 :].split(b"\r\n") if line_end >= 0 else ():
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.fullmatch(name):
                return None  # obs-fold, malformed or spaced names: aiohttp decides
            value = value.strip()
            lower = name.lower()
            if lower == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
            elif lower in (b"transfer-encoding", b"expect", b"upgrade"):
                return None
            elif lower == b"connection" and b"close" in value.lower():
                self.closing = True
            elif lower == b"authorization" and authorization is None:  # the first, as aiohttp reads it
                authorization = value.decode("latin-1")
            headers.append((name, value))
        if length is None:
            return None
        return path, length, headers, authorization

    async def _serve(self, path: str, headers, raw: bytes, hold) -> None:
        sink = RawSink(self)
        try:
            await self.server.routed.handle(sink, "POST", path, headers, raw, perf_counter())
            if self._paused:  # answers are not being read: read no further request until they are
                await asyncio.wait_for(self.drain(), IDLE_CLOSE_S)
        except asyncio.TimeoutError:
            self.abort()  # the client stopped reading long ago
        except TRANSPORT_ERRORS:
            self.closing = True  # the client left while we answered
        finally:
            self.server.budget.release(hold)
            self.busy = False
            self._task = None
            self.last_active = self._loop.time()
        if self.closing or self.transport.is_closing():
            self.transport.close()
            return
        self.transport.resume_reading()
        if self.buffer:
            self.reading_since = self.last_active
            self._next()

    def _hand_over(self) -> None:
        """Give this connection, and what it has sent so far, to aiohttp's server."""
        self.handed_over = True
        self.server.front_connections.discard(self)
        handler = self.server.aiohttp_server()
        self.transport.set_protocol(handler)
        handler.connection_made(self.transport)
        data, self.buffer = bytes(self.buffer), bytearray()
        if data:
            handler.data_received(data)

    async def close(self, timeout: float) -> None:
        """Let the request in flight finish (up to `timeout`), cancel it if it has not, then close. `asyncio.wait`
        never raises what the request ended with: a request whose client left meanwhile is cancelled
        (`connection_lost`), and awaiting it directly raised that CancelledError (a BaseException) out of the
        proxy's shutdown, a traceback and an unclosed session on every SIGTERM."""
        task = self._task
        if task is not None:
            await asyncio.wait([task], timeout=timeout)
            if not task.done():
                task.cancel()  # its upstream request too; the replica stops generating for nobody
                await asyncio.wait([task], timeout=1.0)
        if self.transport is not None and not self.handed_over:
            self.transport.close()


async def close_idle_forever(server, interval_s: float = 10.0) -> None:
    """Close idle and too slow front connections (the server runs this as a task)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        close_idle(server, loop.time())


def close_idle(server, now: float) -> int:
    """Answer 408 to requests still arriving after --request-read-timeout-s, close connections silent for
    IDLE_CLOSE_S; either releases the body budget they held. Returns how many were closed."""
    deadline = server.settings.request_read_timeout_s
    closed = 0
    for front in list(server.front_connections):
        if front.busy:
            continue
        if front.reading_since is not None and now - front.reading_since >= deadline:
            message = f"the request did not arrive whole within {deadline:g}s (--request-read-timeout-s)"
            front.refuse(408, message, "RequestTimeout")
        elif now - front.last_active >= IDLE_CLOSE_S:
            front.transport.close()  # connection_lost releases any body budget it held
        else:
            continue
        closed += 1
    return closed
