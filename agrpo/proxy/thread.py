"""Run a proxy on its own event loop in a background thread (launchers, tests, notebooks)."""

import asyncio
import threading

from agrpo.proxy.server import ProxyServer
from agrpo.proxy.settings import ProxySettings


class ProxyThread:
    """Handle of a proxy running in a daemon thread: `.url`, `.server`, `.stop()`."""

    def __init__(self, server: ProxyServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self.server = server
        self.url: str = server.url
        self._loop = loop
        self._thread = thread

    def call(self, coro, timeout: float = 60.0):
        """Run a coroutine on the proxy's loop (e.g. to inspect state) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> "ProxyThread":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_proxy_thread(settings: ProxySettings, timeout: float = 60.0) -> ProxyThread:
    """Start a proxy and return once it listens; startup errors are raised here."""
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            server = ProxyServer(settings)
            loop.run_until_complete(server.start())
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err
            loop.close()
            ready.set()
            return
        box["server"], box["loop"] = server, loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(server.stop())
            loop.close()

    thread = threading.Thread(target=run, name="agrpo-proxy", daemon=True)
    thread.start()
    if not ready.wait(timeout):
        raise TimeoutError(f"the proxy did not start within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return ProxyThread(box["server"], box["loop"], thread)
