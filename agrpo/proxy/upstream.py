"""HTTP plumbing shared by the proxy's handlers: headers in and out, error bodies, one send."""

import asyncio
import json
import logging
import re

import aiohttp
from aiohttp import web

from agrpo.proxy.broadcast import Reply
from agrpo.proxy.replicas import Replica

# never forwarded upstream: hop-by-hop, recomputed, or the client's own credentials
_DROP_UPSTREAM = frozenset(
    (
        "host",
        "authorization",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",
        # who the client says it is or came through: a replica (uvicorn trusts X-Forwarded-For from loopback) must
        # never take a client's word for it
        "forwarded",
        "x-real-ip",
    )
)
# never forwarded upstream either, by prefix: proxy-* hop-by-hop, agrpo's own headers (X-Agrpo-Replica...), and
# X-Forwarded-For / -Host / -Proto
_DROP_UPSTREAM_PREFIXES = (b"proxy-", b"x-agrpo-", b"x-forwarded-")
# never copied back to the client: hop-by-hop or set by our own server
_DROP_DOWNSTREAM = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "date",
        "server",
    )
)
_OWN_PREFIX = "x-agrpo-"  # the proxy's own headers: never a replica's, either way
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)  # incl. UpstreamClosed
REPLICA_HEADER = "X-Agrpo-Replica"


_DROP_UPSTREAM_RAW = frozenset(name.encode() for name in _DROP_UPSTREAM)


def forwarded_head_lines(raw_headers) -> bytes:
    """The client's raw headers as request-head lines (bytes as received: nothing decoded or re-encoded), minus
    hop-by-hop ones (those RFC 9110 names and those the client's Connection header names), its Authorization, its
    claims about where it came from, and agrpo's own headers."""
    lines, connection = [], None
    for k, v in raw_headers:
        lower = k.lower()
        if lower in _DROP_UPSTREAM_RAW or lower.startswith(_DROP_UPSTREAM_PREFIXES):
            if lower == b"connection":
                connection = v
            continue
        lines.append(k + b": " + v + b"\r\n")
    named = {t.strip().lower() for t in connection.split(b",")} - _DROP_UPSTREAM_RAW if connection else None
    if not named:  # the common case: no Connection header, or one naming only what is dropped anyway
        return b"".join(lines)
    return b"".join(line for line in lines if line.split(b":", 1)[0].lower() not in named)


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token (RFC 9110)
_CONTROL_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # any control character but HTAB


_NAME_VERDICTS: dict[str, bool] = {}  # names repeat from answer to answer: each is checked once (bounded)


def safe_header(name: str, value: str) -> bool:
    """Whether a replica's header may reach the client: a token name and a value without control characters (a
    bare CR or LF inside a value would let a replica start headers, or a whole response, of its own)."""
    ok = _NAME_VERDICTS.get(name)
    if ok is None:
        ok = _HEADER_NAME.fullmatch(name) is not None
        if len(_NAME_VERDICTS) < 1024:
            _NAME_VERDICTS[name] = ok
    # isprintable() is the fast yes for plain values; a tab or non-ASCII text goes to the exact check
    return ok and (value.isprintable() or _CONTROL_IN_VALUE.search(value) is None)


def response_headers(pairs, replica: Replica | None) -> list[tuple[str, str]]:
    """A replica's response headers (name, value pairs) as sent on to the client, minus hop-by-hop ones, any that
    `safe_header` refuses, and any X-Agrpo-* of the replica's own: those are the proxy's to set (a client reads the
    first X-Agrpo-Replica, so a replica's would pass for the proxy's word on who served it)."""
    headers = [
        (k, v)
        for k, v in pairs
        if (lower := k.lower()) not in _DROP_DOWNSTREAM and not lower.startswith(_OWN_PREFIX) and safe_header(k, v)
    ]
    if replica is not None:
        headers.append((REPLICA_HEADER, str(replica.index)))
    return headers


class OneLineLog(logging.LoggerAdapter):
    """aiohttp's server log with a client's malformed request (or its leaving early) as one line: what was wrong, no
    traceback. An error in the proxy's own handlers keeps its traceback."""

    def __init__(self, logger: logging.Logger):
        super().__init__(logger, {})

    def log(self, level, msg, *args, exc_info=None, **kwargs):
        if isinstance(exc_info, (aiohttp.http_exceptions.HttpProcessingError, ConnectionError)):
            what = " ".join(f"{type(exc_info).__name__}: {exc_info}".split())
            what = what.encode("ascii", "backslashreplace").decode()[:300]
            msg, args, exc_info, level = f"{msg}: %s", (*args, what), None, min(level, logging.INFO)
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)


def error_body(status: int, message: str, kind: str = "ProxyError") -> bytes:
    """vLLM's error shape, so clients that print vLLM errors print ours too."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def json_error(
    status: int,
    message: str,
    kind: str = "ProxyError",
    replica: Replica | None = None,
    extra_headers: dict | None = None,
) -> web.Response:
    """An error in vLLM's shape, so clients that print vLLM errors print ours too."""
    headers = dict(extra_headers or {})
    if replica is not None:
        headers[REPLICA_HEADER] = str(replica.index)
    return web.Response(
        status=status, body=error_body(status, message, kind), content_type="application/json", headers=headers or None
    )


def describe_error(err: BaseException) -> str:
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}"


async def send_once(
    session: aiohttp.ClientSession, replica: Replica, method: str, path_qs: str, body: bytes, headers: dict, timeout
) -> Reply:
    """One buffered request to one replica; transport failures become `Reply(None, ...)`.

    The upstream token is added here only for replicas allowed to receive it. Redirects are never followed: a
    replica answering 3xx to a probe or a broadcast has not done what was asked (and following it would carry the
    token elsewhere).
    """
    if replica.authorization:
        headers = {**headers, "Authorization": replica.authorization}
    try:
        async with session.request(
            method, replica.target(path_qs), data=body or None, headers=headers, timeout=timeout, allow_redirects=False
        ) as response:
            payload = await response.read()
            return Reply(response.status, payload, response.headers.get("Content-Type", "application/octet-stream"))
    except TRANSPORT_ERRORS as err:
        return Reply(None, b"", error=describe_error(err))
