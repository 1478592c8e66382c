"""Pick free TCP ports on this machine (the only I/O is a bind test)."""

from __future__ import annotations

import socket

from agrpo.errors import LaunchError


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, start: int, host: str = "127.0.0.1", search: int = 1000) -> list[int]:
    """`count` free ports at or above `start`, skipping ports in use."""
    found = []
    for port in range(start, min(start + search, 65536)):
        if port_free(port, host):
            found.append(port)
            if len(found) == count:
                return found
    raise LaunchError(f"no {count} free ports between {start} and {start + search} on {host}: change inference.base_port")
