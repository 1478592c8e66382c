"""A lean HTTP/1.1 client for the routed hot path: pooled keep-alive connections per replica.

aiohttp's client spends most of the proxy's CPU per request (request and response objects,
header multidicts, timers); this one writes the request head and the untouched body in one go
and parses only the status line, the headers and the body framing (Content-Length or chunked).
Control-plane calls (broadcasts, probes) keep using aiohttp.
"""

import asyncio
import ssl as ssl_module
import time
from collections import deque
from urllib.parse import urlsplit

IDLE_REUSE_S = 2.0  # uvicorn (vLLM) closes idle keep-alive connections after 5 s


class UpstreamClosed(ConnectionResetError):
    """The replica closed the connection before the response was complete."""


class Response:
    """Status line, headers and body framing of one upstream response."""

    __slots__ = ("status", "headers", "content_type", "keep_alive", "_conn")

    def __init__(self, status, headers, conn):
        self.status = status
        self.headers = headers  # [(name, value)], as received
        self.content_type = ""
        self.keep_alive = True
        for name, value in headers:
            lower = name.lower()
            if lower == "content-type":
                self.content_type = value.split(";", 1)[0].strip().lower()
            elif lower == "connection" and value.strip().lower() == "close":
                self.keep_alive = False
        self._conn = conn

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        async for chunk in self.iter_chunks():
            parts.append(chunk)
        return b"".join(parts)

    async def iter_chunks(self):
        """Body bytes as they arrive; raises UpstreamClosed if the replica cuts it short."""
        conn = self._conn
        while True:
            chunk = await conn.next_body_chunk()
            if chunk is None:
                return
            yield chunk


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self):
        self.transport = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._buffer = bytearray()
        self._head_waiter = None
        self._body_waiter = None
        self._body = deque()
        self._mode = None  # "length" | "chunked" | "close"
        self._remaining = 0
        self._done = True
        self._error: BaseException | None = None
        self._got_bytes = False
        self._keep_alive = True
        self._no_body = False  # the answer to a HEAD request has no body, whatever it declares

    # -- protocol callbacks
    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        if self._mode == "close" and not self._done:
            self._done = True
            self._wake_body()
            return
        self._fail(UpstreamClosed("the replica closed the connection" + (f" ({exc})" if exc else "")))

    def data_received(self, data):
        self._got_bytes = True
        self._buffer += data
        if self._head_waiter is not None:
            self._parse_head()
        if self._mode is not None and not self._done:
            self._parse_body()

    # -- request / response
    def send(self, head: bytes, body: bytes, no_body: bool = False):
        if self.closed or self.transport is None or self.transport.is_closing():
            raise UpstreamClosed("the replica closed the connection")
        loop = asyncio.get_running_loop()
        self._head_waiter = loop.create_future()
        self._mode, self._done, self._error, self._got_bytes = None, False, None, False
        self._no_body = no_body
        self._buffer.clear()
        self._body.clear()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self._head_waiter

    @property
    def got_bytes(self) -> bool:
        return self._got_bytes

    def reusable(self) -> bool:
        return (
            not self.closed
            and self._done
            and self._error is None
            and self._keep_alive
            and time.monotonic() - self.idle_since < IDLE_REUSE_S
        )

    def abort(self, error: BaseException) -> None:
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: BaseException) -> None:
        if self._done and self._head_waiter is None:
            return
        self._error = error
        self._done = True
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self._wake_body()

    def _parse_head(self):
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > 65536:
                self.abort(UpstreamClosed("the replica sent a response head over 64 KiB"))
            return
        head = bytes(self._buffer[:end]).decode("latin-1")
        del self._buffer[: end + 4]
        lines = head.split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self.abort(UpstreamClosed(f"the replica sent a malformed status line {lines[0][:80]!r}"))
            return
        headers = []
        length = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            value = value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == "content-length":
                length = int(value) if value.isdigit() else None
            elif lower == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        response = Response(status, headers, self)
        self._keep_alive = response.keep_alive
        if self._no_body:
            self._mode, self._remaining = "length", 0
        elif chunked:
            self._mode = "chunked"
        elif length is not None:
            self._mode, self._remaining = "length", length
        elif status in (204, 304) or 100 <= status < 200:
            self._mode, self._remaining = "length", 0
        else:
            self._mode = "close"
            response.keep_alive = False
        waiter, self._head_waiter = self._head_waiter, None
        waiter.set_result(response)

    def _parse_body(self):
        buf = self._buffer
        if self._mode == "length":
            if buf:
                take = min(len(buf), self._remaining)
                if take:
                    self._body.append(bytes(buf[:take]))
                    del buf[:take]
                    self._remaining -= take
            if self._remaining == 0:
                self._done = True
        elif self._mode == "close":
            if buf:
                self._body.append(bytes(buf))
                buf.clear()
        else:
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    break
                try:
                    size = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
                except ValueError:
                    self.abort(UpstreamClosed("the replica sent a malformed chunk"))
                    return
                if size == 0:  # last chunk, then optional trailers and an empty line
                    if not (buf.startswith(b"\r\n", line_end + 2) or buf.find(b"\r\n\r\n", line_end) >= 0):
                        break
                    del buf[:]
                    self._done = True
                    break
                if len(buf) < line_end + 2 + size + 2:
                    break
                self._body.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
                del buf[: line_end + 2 + size + 2]
        self._wake_body()

    def _wake_body(self):
        waiter, self._body_waiter = self._body_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_body_chunk(self):
        while True:
            if self._body:
                return self._body.popleft()
            if self._error is not None:
                raise self._error
            if self._done:
                self.idle_since = time.monotonic()
                return None
            self._body_waiter = asyncio.get_running_loop().create_future()
            await self._body_waiter


class Pool:
    """Idle connections per replica base URL; new ones opened as needed (no upper limit)."""

    def __init__(self, connect_timeout_s: float):
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[Connection]] = {}
        self._targets: dict[str, tuple] = {}
        self._ssl = None

    def _target(self, base_url: str):
        target = self._targets.get(base_url)
        if target is None:
            parts = urlsplit(base_url)
            secure = parts.scheme == "https"
            port = parts.port or (443 if secure else 80)
            default = 443 if secure else 80
            host_header = parts.hostname if port == default else f"{parts.hostname}:{port}"
            if ":" in parts.hostname:
                host_header = f"[{parts.hostname}]" + ("" if port == default else f":{port}")
            target = self._targets[base_url] = (parts.hostname, port, secure, host_header)
        return target

    def host_header(self, base_url: str) -> str:
        return self._target(base_url)[3]

    async def acquire(self, base_url: str) -> tuple[Connection, bool]:
        """(connection, reused) for `base_url`."""
        idle = self._idle.get(base_url)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn, True
            if conn.transport is not None:
                conn.transport.close()
        host, port, secure, _ = self._target(base_url)
        if secure and self._ssl is None:
            self._ssl = ssl_module.create_default_context()
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(Connection, host, port, ssl=self._ssl if secure else None), self.connect_timeout_s
        )
        return conn, False

    def release(self, base_url: str, conn: Connection, keep_alive: bool) -> None:
        if keep_alive and conn.reusable():
            idle = self._idle.setdefault(base_url, [])
            idle.append(conn)
            if len(idle) > 64 and not idle[0].reusable():  # drop those gone stale at the bottom
                for stale in [c for c in idle if not c.reusable()]:
                    if stale.transport is not None:
                        stale.transport.close()
                self._idle[base_url] = [c for c in idle if c.reusable()]
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


class Exchange:
    """One request to one replica over the pool, bounded by a total timeout.

    A reused keep-alive connection that the replica had closed in the meantime (no byte of an
    answer came back) is retried once on a fresh connection: that is not the replica failing.
    While it runs it is in `replica.exchanges`, so that the control plane can `drop` it when the
    replica stops answering (the routed path then retries it on another replica).
    """

    __slots__ = ("pool", "replica", "timeout_s", "model", "conn", "retired", "_timer", "_expired", "_dropped")

    def __init__(self, pool: Pool, replica, timeout_s: float, model: str | None = None):
        self.pool = pool
        self.replica = replica
        self.timeout_s = timeout_s
        self.model = model  # the adapter the request names (stale_abort.py drops it once that version is retired)
        self.conn: Connection | None = None
        self.retired = False  # dropped because its adapter version was retired: not the replica's failure
        self._timer = None
        self._expired = False
        self._dropped: str | None = None

    async def send(self, method: str, path_qs: str, head_lines: bytes, body: bytes) -> Response:
        self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        self.replica.exchanges.add(self)
        url = self.replica.url
        auth = self.replica.authorization
        head = (
            f"{method} {path_qs} HTTP/1.1\r\nHost: {self.pool.host_header(url)}\r\n".encode("utf-8", "surrogateescape")
            + head_lines
            + (f"Authorization: {auth}\r\n".encode() if auth else b"")
            + b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for attempt in range(2):
            conn, reused = await self.pool.acquire(url)
            self.conn = conn
            if self._expired:
                raise asyncio.TimeoutError()
            if self._dropped is not None:
                raise UpstreamClosed(self._dropped)
            try:
                return await conn.send(head, body, no_body=method == "HEAD")
            except UpstreamClosed:
                if self._expired:
                    raise asyncio.TimeoutError() from None
                if reused and not conn.got_bytes and attempt == 0 and self._dropped is None:
                    continue
                raise
        raise UpstreamClosed("unreachable")

    def _expire(self) -> None:
        self._expired = True
        if self.conn is not None:
            self.conn.abort(asyncio.TimeoutError())

    def abort(self) -> None:
        if self.conn is not None:
            self.conn.abort(UpstreamClosed("aborted by the proxy"))
            self.conn = None

    def drop(self, reason: str) -> None:
        """Give up on the replica's answer now (it stopped answering): whoever awaits it gets UpstreamClosed."""
        self._dropped = reason
        if self.conn is not None:
            self.conn.abort(UpstreamClosed(reason))

    def finish(self) -> None:
        """Give the connection back if its answer was read to the end, else drop it."""
        self.replica.exchanges.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.release(self.replica.url, conn, conn.reusable())
