"""Replica URLs: which ones are refused, and the one canonical spelling of those accepted. Pure code.

A replica URL is `http(s)://host[:port]` and nothing else. Two spellings that reach the same server
(`HTTP://127.0.0.1:8001`, `http://0x7f.1:8001`, `http://[::ffff:7f00:1]:8001`) have one canonical
form, so a replica cannot be added twice under different names, and a host that no resolver would
take (`..`, `[127.0.0.1]`) or port 0 is refused up front instead of failing at every probe.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_NUMERIC_PART = re.compile(r"0[xX][0-9A-Fa-f]*|[0-9]+")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class BadReplicaUrl(ValueError):
    """Why a string cannot be a replica URL (the message names the URL, never a password)."""


def _ipv4_number_forms(host: str) -> ipaddress.IPv4Address | None:
    """The address of `host` if it is an IPv4 address in any form the C resolver accepts (`127.1`, `0x7f.1`,
    `2130706433`, `0177.0.0.1`), None if it is not made of numbers. Raises BadReplicaUrl when it is made of numbers
    but out of range (`999.1.1.1`): a resolver would not take it as a name either."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for part in parts:
        if part[:2].lower() == "0x":
            values.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            if any(c in "89" for c in part):
                raise BadReplicaUrl(f"{host!r} is not an IPv4 address (an octal part holds 8 or 9)")
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *leading, last = values
    if any(v > 255 for v in leading) or last >= 256 ** (5 - len(values)):
        raise BadReplicaUrl(f"{host!r} is not an IPv4 address (a part is out of range)")
    number = last
    for index, value in enumerate(leading):
        number += value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def canonical_host(host: str) -> str:
    """The one spelling of a host: IPv4 dotted quad (IPv4-mapped IPv6 too), compressed IPv6 in brackets, or a
    lower-case name without a trailing dot. Raises BadReplicaUrl for anything else."""
    if host.startswith("["):
        if not host.endswith("]"):
            raise BadReplicaUrl(f"{host!r} is not a bracketed IPv6 address")
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise BadReplicaUrl(f"{host!r} is not an IPv6 address (brackets hold IPv6 only)") from None
        if address.scope_id:
            raise BadReplicaUrl(f"{host!r} carries a zone index, which a replica URL cannot")
        mapped = address.ipv4_mapped
        return str(mapped) if mapped is not None else f"[{address.compressed}]"
    name = host[:-1] if host.endswith(".") else host
    address = _ipv4_number_forms(name)
    if address is not None:
        return str(address)
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise BadReplicaUrl(
            f"{host!r} is not a host name (labels of letters, digits, '-' or '_', 1-63 characters, "
            "no empty label) nor an IP address"
        )
    return name.lower()


def parse_replica_url(url: object) -> tuple[str, str, int]:
    """(scheme, canonical host, port) of a replica URL; raises BadReplicaUrl saying why it is refused."""
    if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
        raise BadReplicaUrl(f"replica URL {url!r} must be printable ASCII without spaces")
    try:
        parts = urlsplit(url)
    except ValueError as err:  # e.g. "An IPv4 address cannot be in brackets"
        raise BadReplicaUrl(f"replica URL {url!r} has an invalid host: {err}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.netloc:
        raise BadReplicaUrl(f"replica URL {url!r} must look like http://host:port (http or https)")
    if "@" in parts.netloc:
        shown = f"{scheme}://***@{parts.netloc.rsplit('@', 1)[1]}"  # never echo a password
        raise BadReplicaUrl(f"replica URL {shown!r} must not carry credentials (user:password@)")
    if parts.path not in ("", "/") or "?" in url or "#" in url:
        raise BadReplicaUrl(f"replica URL {url!r} must not have a path, query or fragment (only scheme://host:port)")
    host, port_text = parts.netloc, ""
    if host.endswith("]") or ":" not in host:
        pass
    else:
        host, _, port_text = host.rpartition(":")
    try:
        canonical = canonical_host(host)
    except BadReplicaUrl as err:
        raise BadReplicaUrl(f"replica URL {url!r} has an invalid host: {err}") from None
    if port_text == "":
        if parts.netloc.endswith(":"):
            raise BadReplicaUrl(f"replica URL {url!r} has an empty port")
        return scheme, canonical, _DEFAULT_PORTS[scheme]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadReplicaUrl(f"replica URL {url!r} has an invalid port (1-65535)")
    return scheme, canonical, int(port_text)


def url_problems(url: object) -> list[str]:
    """Why `url` cannot be a replica base URL (empty list when it can).

    No credentials (they would show in stats, metrics and logs), no path, query or fragment (the proxy appends
    request paths to it, so anything there would turn routing into a way to reach arbitrary URLs), a host a resolver
    takes as one server, a port in 1-65535.
    """
    try:
        parse_replica_url(url)
    except BadReplicaUrl as err:
        return [str(err)]
    return []


def canonical_url(url: str) -> str:
    """`scheme://host[:port]` in its one spelling (the default port is left out). Raises BadReplicaUrl."""
    scheme, host, port = parse_replica_url(url)
    return f"{scheme}://{host}" if port == _DEFAULT_PORTS[scheme] else f"{scheme}://{host}:{port}"


def url_host(url: str) -> str:
    """The lower-case host of a (valid) replica URL, without IPv6 brackets."""
    return (urlsplit(url).hostname or "").lower()
