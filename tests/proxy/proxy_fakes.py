"""In-process fake vLLM replicas and a helper that puts a proxy in front of them."""

import asyncio
import contextlib
import json
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from agrpo.proxy import ProxyServer, ProxySettings


@dataclass
class FakeReplica:
    """Speaks the slice of vLLM's HTTP API the proxy uses; every behaviour is switchable."""

    name: str
    seen: list = field(default_factory=list)  # (method, path_qs, body bytes, headers)
    peers: list = field(default_factory=list)  # client (host, port) of every request
    loaded: set = field(default_factory=set)
    paused: bool = False
    healthy: bool = True
    missing_adapter_answers: int = 0  # answer "No adapter found" this many times first
    fail_paths: dict = field(default_factory=dict)  # path -> status to answer instead
    completion_delay_s: float = 0.0
    stream_chunks: int = 3
    stream_gap_s: float = 0.05
    stream_end: str = "done"  # "done" | "cut" (connection dropped mid-way) | "no-done"
    hang_paths: set = field(default_factory=set)  # paths answered only after an hour
    load_delay_s: float = 0.0  # each adapter load takes this long (and lands even if the client gave up)
    redirects: dict = field(default_factory=dict)  # path -> URL answered with a 307 to it
    check_models: bool = False  # completions for an adapter it does not hold get vLLM's 404
    completion_padding: int = 0  # bytes of padding in every completion answer (large answers)
    cancelled: int = 0  # completions abandoned because the client (the proxy) went away
    stream_gate: asyncio.Event | None = None  # when set: a stream waits for it after its first event
    thawed: asyncio.Event | None = None  # while it is not set, the replica is frozen (freeze/thaw: SIGSTOP/SIGCONT)
    url: str = ""
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def start(self, port: int = 0) -> None:
        # handler_cancellation: like vLLM, a request whose client disconnects is abandoned (see `cancelled`)
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.2, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def freeze(self) -> None:
        """Like SIGSTOP: requests are received (the kernel accepts them) but none is answered, /health included."""
        self.thawed = asyncio.Event()

    def thaw(self) -> None:
        """Like SIGCONT: what was received is processed now. A load lands even if the proxy gave up on it (as in
        vLLM), other requests whose client left are abandoned."""
        if self.thawed is not None:
            self.thawed.set()

    async def _frozen(self) -> None:
        if self.thawed is not None:
            await self.thawed.wait()

    def requests(self, path: str) -> list:
        return [s for s in self.seen if s[1].split("?")[0] == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path
        self.seen.append((request.method, request.raw_path, body, dict(request.headers)))
        self.peers.append(request.transport.get_extra_info("peername"))
        if path != "/v1/load_lora_adapter":  # a load waits inside its shield: it lands after a thaw
            await self._frozen()
        if path in self.hang_paths:
            await asyncio.sleep(3600)
        if path in self.redirects:
            raise web.HTTPTemporaryRedirect(self.redirects[path])
        if path in self.fail_paths:
            return web.json_response(
                {"error": {"message": f"{self.name} broke", "code": self.fail_paths[path]}},
                status=self.fail_paths[path],
            )
        if path == "/health":
            return web.Response(status=200 if self.healthy else 503)
        if path in ("/v1/completions", "/v1/chat/completions"):
            return await self._complete(request, json.loads(body))
        if path == "/v1/load_lora_adapter":
            return await asyncio.shield(self._load(json.loads(body)))  # lands even if the client gave up
        if path == "/v1/unload_lora_adapter":
            name = json.loads(body)["lora_name"]
            if name not in self.loaded:
                return web.json_response({"error": {"message": f"'{name}' cannot be found"}}, status=404)
            self.loaded.discard(name)
            return web.Response(text=f"Success: LoRA adapter '{name}' removed")
        if path == "/pause":
            self.paused = True
            return web.json_response({"status": "paused"})
        if path == "/resume":
            self.paused = False
            return web.json_response({"status": "resumed"})
        if path == "/server_info":
            return web.json_response(
                {
                    "vllm_config": {
                        "parallel_config": {"data_parallel_size": 2, "tensor_parallel_size": 1},
                        "lora_config": {"max_lora_rank": 16},
                    }
                }
            )
        if path in ("/reset_prefix_cache", "/sleep", "/wake_up"):
            return web.Response(status=200)
        if path == "/v1/models":
            adapters = [{"id": name, "parent": "base"} for name in sorted(self.loaded)]
            return web.json_response(
                {"data": [{"id": "base", "max_model_len": 512}, *adapters], "served_by": self.name}
            )
        return web.json_response({"error": {"message": "Not Found"}}, status=404)

    async def _load(self, data: dict) -> web.Response:
        await self._frozen()
        if self.load_delay_s:
            await asyncio.sleep(self.load_delay_s)
        if self.missing_adapter_answers > 0:
            self.missing_adapter_answers -= 1
            message = f"Loading lora {data['lora_name']} failed: No adapter found for {data['lora_path']}"
            return web.json_response({"error": {"message": message, "type": "NotFoundError", "code": 404}}, status=404)
        if data["lora_name"] in self.loaded and not data.get("load_inplace"):
            return web.json_response({"error": {"message": "has already been loaded"}}, status=400)
        self.loaded.add(data["lora_name"])
        return web.Response(text=f"Success: LoRA adapter '{data['lora_name']}' added")

    async def _complete(self, request: web.Request, data: dict) -> web.StreamResponse:
        if self.completion_delay_s:
            try:
                await asyncio.sleep(self.completion_delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.check_models and data.get("model") not in self.loaded | {"base"}:
            message = f"The model `{data.get('model')}` does not exist."
            return web.json_response({"error": {"message": message, "type": "NotFoundError", "code": 404}}, status=404)
        if data.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(self.stream_chunks):
                await response.write(f"data: {json.dumps({'i': i, 'by': self.name})}\n\n".encode())
                await asyncio.sleep(self.stream_gap_s)
                if i == 0 and self.stream_gate is not None:
                    await self.stream_gate.wait()
            if self.stream_end == "cut":  # the replica dies: no last chunk, no [DONE]
                request.transport.abort()
                return response
            if self.stream_end == "done":
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {
                "choices": [{"text": "ok", "token_ids": [1, 2]}],
                "model": data.get("model"),
                "served_by": self.name,
                **({"padding": "x" * self.completion_padding} if self.completion_padding else {}),
            },
            headers={"X-Request-Id": "r1"},
        )


def cluster(n: int = 2, **overrides):
    """n started fake replicas, a proxy on a free port in front of them, and a client."""
    return serve([FakeReplica(name=f"r{i}") for i in range(n)], **overrides)


@contextlib.asynccontextmanager
async def serve(fakes: list, **overrides):
    """`fakes` started, a proxy on a free port in front of them (ProxySettings `overrides`), and a client."""
    for fake in fakes:
        await fake.start()
    settings = ProxySettings(upstreams=[f.url for f in fakes], port=0, **{"health_interval_s": 0.2, **overrides})
    proxy = ProxyServer(settings)
    await proxy.start()
    session = aiohttp.ClientSession()
    try:
        yield proxy, fakes, session
    finally:
        await session.close()
        await proxy.stop()
        for fake in fakes:
            await fake.stop()


def completion(prompt, model: str = "trl-policy-v1", **extra) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 16,
        "n": 1,
        "logprobs": 0,
        "return_token_ids": True,
        **extra,
    }


async def post(session, url: str, payload=None, data: bytes | None = None, headers=None):
    """POST and return (status, headers, body bytes)."""
    async with session.post(url, json=payload if data is None else None, data=data, headers=headers) as response:
        return response.status, response.headers, await response.read()


async def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    """Poll `predicate()`; fail if it does not hold within `timeout` (a bound on a hang, not a measurement)."""
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what} not reached")


async def open_to(proxy):
    """A raw connection (reader, writer) to the proxy."""
    host, port = proxy.url[len("http://") :].rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


def content_length(head: bytes) -> int:
    """The Content-Length of a raw HTTP head (0 without one)."""
    return next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
