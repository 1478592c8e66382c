"""What the proxy's control plane reads from an admin request: a replica's URL, a query value, an adapter's name.

Each answers the value or, for a body that cannot hold one, None or the error response to send (agrpo/proxy/control.py
acts on them).
"""

import json
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from agrpo.proxy.settings import canonical_url, url_problems
from agrpo.proxy.upstream import json_error


async def replica_url_from(request: web.Request, server):
    """The canonical replica URL of a `{"url": ...}` body, or the error to answer (400 naming the reason)."""
    if (request.content_length or 0) > 65536:
        return json_error(413, "a replica request body is a small JSON object", "RequestTooLarge")
    read = await server.read_body(request)
    if isinstance(read, web.Response):
        return read
    body, hold = read
    server.budget.release(hold)
    try:
        url = json.loads(body)["url"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return json_error(400, 'expected a JSON body like {"url": "http://host:port"}', "BadRequestError")
    problems = url_problems(url)
    if problems:
        return json_error(400, f"not a replica URL: {'; '.join(problems)}", "BadRequestError")
    return canonical_url(url)


def query_value(path_qs: str, key: str) -> str | None:
    """The last value of `key` in the request's query string, or None."""
    values = parse_qs(urlsplit(path_qs).query).get(key)
    return values[-1] if values else None


def lora_name(body: bytes) -> str | None:
    """The `lora_name` of an adapter load or unload body, or None when the body names none."""
    try:
        name = json.loads(body).get("lora_name")
    except (ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None
