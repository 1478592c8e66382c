"""The lean front: a raw HTTP/1.1 protocol that serves the routed path itself.

Every client connection starts here. A `POST /v1/completions` or `/v1/chat/completions`
(HTTP/1.1, Content-Length body, nothing unusual) is parsed with a few byte operations and
handed to `RoutedPath` with a `RawSink` that writes the answer straight to the socket. The
first request that is anything else (another path, a chunked upload, `Expect`, an absolute-form
target, a body over the limits...) hands the whole connection, with the bytes already received,
to aiohttp's server, which then serves it to the end with every check it has. aiohttp's server
costs about as much CPU per request as the rest of the proxy together; this path skips it.
"""

import asyncio
import re
from http import HTTPStatus
from time import perf_counter

from agrpo.proxy.upstream import TRANSPORT_ERRORS

_ROUTED = {b"/v1/completions": "/v1/completions", b"/v1/chat/completions": "/v1/chat/completions"}
_MAX_HEAD = 65536
IDLE_CLOSE_S = 75.0  # like aiohttp's keep-alive: a connection silent this long is closed
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # in a head without its CRLFs: refused
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110)


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
        self._pending = None  # (head end, path, length, headers) of a body still arriving
        self.last_active = 0.0

    # -- asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        self.last_active = asyncio.get_running_loop().time()
        self.server.front_connections.add(self)

    def connection_lost(self, exc):
        self.server.front_connections.discard(self)
        self.closing = True
        if self._pending is not None:  # a body that will never complete
            self.server.budget.release(self._pending[2])
            self._pending = None
        self._wake()

    def data_received(self, data):
        self.last_active = asyncio.get_running_loop().time()
        self.buffer += data
        if not self.busy:
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

    # -- requests
    def _next(self) -> None:
        buffer = self.buffer
        if self._pending is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    self._hand_over()
                return
            request = self._lean_request(bytes(buffer[:end]))
            if request is None:
                self._hand_over()
                return
            path, length, headers = request
            budget = self.server.budget
            if length > self.server.settings.max_body_bytes or not budget.fits(length):
                self._hand_over()  # aiohttp answers 413 / 503 without reading the body
                return
            budget.reserve(length)
            self._pending = (end, path, length, headers)  # the budget is held from now on
        end, path, length, headers = self._pending
        if len(buffer) < end + 4 + length:
            return
        self._pending = None
        raw = bytes(buffer[end + 4 : end + 4 + length])
        del buffer[: end + 4 + length]
        self.busy = True
        self._task = asyncio.get_running_loop().create_task(self._serve(path, headers, raw, length))

    def _lean_request(self, head: bytes):
        """(path, content length, raw header pairs) when the lean path may serve it, else None.

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
        length = None
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
            headers.append((name, value))
        if length is None:
            return None
        return path, length, headers

    async def _serve(self, path: str, headers, raw: bytes, held: int) -> None:
        sink = RawSink(self)
        try:
            await self.server.routed.handle(sink, "POST", path, headers, raw, perf_counter())
        except TRANSPORT_ERRORS:
            self.closing = True  # the client left while we answered
        finally:
            self.server.budget.release(held)
            self.busy = False
            self._task = None
            self.last_active = asyncio.get_running_loop().time()
        if self.closing or self.transport.is_closing():
            self.transport.close()
            return
        self.transport.resume_reading()
        if self.buffer:
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

    def idle_since(self, now: float) -> float:
        """Seconds without a byte from the client and with no answer under way (0 if busy).

        A head with half a body also counts as idle: a client that stops mid-body must not
        hold its share of the body budget forever."""
        return 0.0 if self.busy else now - self.last_active

    async def close(self, timeout: float) -> None:
        """Let the request in flight finish (up to `timeout`), then close."""
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except (asyncio.TimeoutError, Exception):
                pass
        if self.transport is not None and not self.handed_over:
            self.transport.close()


async def close_idle_forever(server, interval_s: float = 10.0) -> None:
    """Close front connections idle for IDLE_CLOSE_S (the server runs this as a task)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        close_idle(server, loop.time())


def close_idle(server, now: float) -> int:
    idle = [f for f in list(server.front_connections) if f.idle_since(now) >= IDLE_CLOSE_S]
    for front in idle:
        front.transport.close()  # connection_lost releases any body budget it held
    return len(idle)
