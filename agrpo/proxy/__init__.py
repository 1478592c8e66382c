"""One vLLM server to the trainer, N replicas behind it.

    python -m agrpo.proxy --upstream http://127.0.0.1:8001 --upstream http://127.0.0.1:8002

In process: `ProxyServer(settings)` (`await start()` / `await stop()`, `.url`) or
`start_proxy_thread(settings)` (a handle with `.url` and `.stop()`). See docs/proxy.md.
"""

from agrpo.proxy.routing import Decision, Router
from agrpo.proxy.server import ProxyServer
from agrpo.proxy.settings import ProxySettings
from agrpo.proxy.thread import ProxyThread, start_proxy_thread

__all__ = ["Decision", "ProxyServer", "ProxySettings", "ProxyThread", "Router",
           "start_proxy_thread"]
