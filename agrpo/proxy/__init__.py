"""One vLLM server to the trainer, N replicas behind it.

    python -m agrpo.proxy --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002

In process: `ProxyServer(settings)` (`await start()` / `await stop()`, `.url`) or
`start_proxy_thread(settings)` (a handle with `.url` and `.stop()`). See docs/proxy.md.

The exports are loaded on first use (PEP 562), so that the config layer, which embeds
`agrpo.proxy.settings.ProxySettings`, does not import the HTTP server (aiohttp) with it.
"""

import importlib

_EXPORTS = {
    "Decision": "agrpo.proxy.routing",
    "Router": "agrpo.proxy.routing",
    "ProxyServer": "agrpo.proxy.server",
    "ProxySettings": "agrpo.proxy.settings",
    "ProxyThread": "agrpo.proxy.thread",
    "start_proxy_thread": "agrpo.proxy.thread",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agrpo.proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
