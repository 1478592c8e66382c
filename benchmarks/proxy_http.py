"""Part 2 of benchmarks/proxy_bench.py: the real proxy process over HTTP.

A minimal upstream that answers at once and keep-alive clients, all in the bench process (on
the cores the proxy is not pinned to); the proxy runs as its own process pinned to one core.
Run through proxy_bench.py.
"""

import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

G = 8  # rollouts per prompt (a GRPO group)


RESPONSE_BODY = json.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": "x" * 40,
                "token_ids": list(range(16)),
                "finish_reason": "length",
                "logprobs": {"token_logprobs": [-0.5] * 16},
            }
        ],
    }
).encode()
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(RESPONSE_BODY)).encode()
    + b"\r\n\r\n"
    + RESPONSE_BODY
)


def body_length(head: bytes) -> int:
    """Content-Length of an HTTP head (0 when absent)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class MinimalUpstream(asyncio.Protocol):
    """Answers every request at once (with `response`): the proxy's cost is all that is left to measure."""

    response = RESPONSE

    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = body_length(self.buffer[:head_end])
            if len(self.buffer) < head_end + 4 + length:
                return
            self.buffer = self.buffer[head_end + 4 + length :]
            self.transport.write(self.response)


class Client(asyncio.Protocol):
    """A keep-alive HTTP/1.1 client that sends one request after the other."""

    def __init__(self):
        self.buffer, self.waiter = b"", None

    def connection_made(self, transport):
        self.transport = transport

    async def request(self, raw):
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter

    def data_received(self, data):
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        length = body_length(self.buffer[:head_end])
        if len(self.buffer) >= head_end + 4 + length:
            status = int(self.buffer[9:12])
            self.buffer = self.buffer[head_end + 4 + length :]
            self.waiter.set_result(status)


def request_bytes(body, port, token=None):
    """A completions request for `body` (bytes), with `Authorization: Bearer <token>` when a token is given."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\n{auth}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def connect(port):
    _, client = await asyncio.get_running_loop().create_connection(Client, "127.0.0.1", port)
    return client


async def paired_latencies(ports, bodies):
    """One request at a time, alternating targets, so drift and noise hit both alike."""
    clients = [await connect(port) for port in ports]
    out = [[] for _ in ports]
    for body in bodies:
        for client, port, times in zip(clients, ports, out):
            raw = request_bytes(body, port)
            started = time.perf_counter()
            assert await client.request(raw) == 200
            times.append(time.perf_counter() - started)
    for client in clients:
        client.transport.close()
    return out


def cpu_seconds(pid):
    """User + system CPU time a process has used (Linux /proc), to measure per-core capacity."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def max_rate(port, bodies, connections, seconds, pid):
    """(requests/s of wall time, requests per CPU-second of the proxy process)."""
    return await raw_rate(port, [request_bytes(b, port) for b in bodies], pid, seconds, connections)


async def raw_rate(port, raws, pid, seconds, connections=64):
    """max_rate of ready-made requests (`raws`, sent in turn over `connections` keep-alive clients)."""
    clients = [await connect(port) for _ in range(connections)]
    done, stop_at = 0, time.perf_counter() + seconds

    async def drive(client, offset):
        nonlocal done
        i = offset
        while time.perf_counter() < stop_at:
            status = await client.request(raws[i % len(raws)])
            assert status == 200, f"the server on port {port} answered {status}"
            done, i = done + 1, i + connections

    started, cpu_before = time.perf_counter(), cpu_seconds(pid)
    await asyncio.gather(*(drive(c, k) for k, c in enumerate(clients)))
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu_before
    for client in clients:
        client.transport.close()
    return done / wall, done / max(cpu, 1e-9)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_proxy(upstream_port, core, checkout=Path(__file__).resolve().parents[1], flags=(), env=None):
    """The proxy of `checkout` (this one by default) as a process pinned to `core`; `flags` follow the usual ones,
    `env` adds to the environment."""
    port = free_port()
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agrpo.proxy",
            "--upstream",
            f"http://127.0.0.1:{upstream_port}",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *flags,
        ],
        cwd=checkout,
        preexec_fn=pin,
        stdout=subprocess.PIPE,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(checkout)},
    )
    return process, port


async def http_numbers(quick):
    cores = sorted(os.sched_getaffinity(0))
    proxy_core = cores[0] if len(cores) > 1 else None
    if proxy_core is not None:
        os.sched_setaffinity(0, set(cores[1:]))  # client and upstream on the other core(s)
    server = await asyncio.get_running_loop().create_server(MinimalUpstream, "127.0.0.1", 0)
    upstream_port = server.sockets[0].getsockname()[1]
    process, proxy_port = start_proxy(upstream_port, proxy_core)
    await asyncio.to_thread(process.stdout.readline)  # "listening on ...", after its probe
    rng = random.Random(0)
    try:
        count = 300 if quick else 2000
        long_bodies = [
            json.dumps(
                {
                    "model": "trl-policy-v3",
                    "max_tokens": 256,
                    "n": 1,
                    "prompt": [rng.randrange(150_000) for _ in range(4096)],
                    "logprobs": 0,
                }
            ).encode()
            for _ in range(count // G)
        ]
        long_bodies = [b for b in long_bodies for _ in range(G)]  # GRPO groups
        await paired_latencies([proxy_port], long_bodies[:200])  # warm up
        direct, proxied = await paired_latencies([upstream_port, proxy_port], long_bodies)
        short_bodies = [
            json.dumps(
                {
                    "model": "trl-policy-v3",
                    "max_tokens": 256,
                    "n": 1,
                    "prompt": [rng.randrange(150_000) for _ in range(256)],
                }
            ).encode()
            for _ in range(512)
        ]
        short_bodies = [b for b in short_bodies for _ in range(G)]
        seconds = 3 if quick else 8
        rate_short = await max_rate(proxy_port, short_bodies, 64, seconds, process.pid)
        rate_long = await max_rate(proxy_port, long_bodies, 64, seconds, process.pid)
        ratio = await throughput_ratio(
            upstream_port, proxy_port, process.pid, rng, rounds=2 if quick else 3, seconds=2 if quick else 4
        )
    finally:
        process.terminate()
        process.wait()
        server.close()
    pct = lambda xs, q: statistics.quantiles(xs, n=100)[q - 1] * 1000  # noqa: E731
    return {
        "p50_added_ms": pct(proxied, 50) - pct(direct, 50),
        "p99_added_ms": pct(proxied, 99) - pct(direct, 99),
        "rps_256": rate_short,
        "rps_4096": rate_long,
        "one_core": proxy_core is not None,
        **ratio,
    }


def bodies_128(rng):
    bodies = [
        json.dumps(
            {
                "model": "trl-policy-v3",
                "max_tokens": 256,
                "n": 1,
                "prompt": [rng.randrange(150_000) for _ in range(128)],
            }
        ).encode()
        for _ in range(512)
    ]
    return [b for b in bodies for _ in range(G)]


async def alternating_rates(targets, bodies, rounds, seconds):
    """Median (requests/s, requests per CPU-second) per target, 64 clients each; the targets
    take turns `rounds` times so that load from other processes hits them alike."""
    runs = {name: [] for name, _, _ in targets}
    for _ in range(rounds):
        for name, port, pid in targets:
            runs[name].append(await max_rate(port, bodies, 64, seconds, pid))
    return {
        name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for name, rs in runs.items()
    }


async def throughput_ratio(upstream_port, proxy_port, pid, rng, rounds, seconds):
    """64 clients, 128-token prompts in GRPO groups: proxied requests/s as a ratio to direct
    (the ratio of the medians; issue 12 item 6 asks for 2x)."""
    rates = await alternating_rates(
        [("direct", upstream_port, os.getpid()), ("proxy", proxy_port, pid)], bodies_128(rng), rounds, seconds
    )
    (direct, cpu_direct), (proxied, cpu_proxied) = rates["direct"], rates["proxy"]
    # per CPU-second: the proxy process's against the direct path's (client + upstream in
    # this process); what one core can do, whatever else shares the machine
    return {
        "rps_direct_128": direct,
        "rps_proxy_128": proxied,
        "ratio_128": proxied / direct,
        "cpu_direct_128": cpu_direct,
        "cpu_proxy_128": cpu_proxied,
        "cpu_ratio_128": cpu_proxied / cpu_direct,
    }


async def compare(other: Path, rounds: int, seconds: float) -> None:
    """This checkout's proxy against `other`'s (e.g. a worktree of an older commit), both
    pinned to the same core, taking turns with the direct path in one run."""
    cores = sorted(os.sched_getaffinity(0))
    proxy_core = cores[0] if len(cores) > 1 else None
    if proxy_core is not None:
        os.sched_setaffinity(0, set(cores[1:]))
    server = await asyncio.get_running_loop().create_server(MinimalUpstream, "127.0.0.1", 0)
    upstream_port = server.sockets[0].getsockname()[1]
    this, this_port = start_proxy(upstream_port, proxy_core)
    that, that_port = start_proxy(upstream_port, proxy_core, other)
    try:
        for process in (this, that):
            await asyncio.to_thread(process.stdout.readline)
        rates = await alternating_rates(
            [("direct", upstream_port, os.getpid()), ("this", this_port, this.pid), ("other", that_port, that.pid)],
            bodies_128(random.Random(0)),
            rounds,
            seconds,
        )
    finally:
        for process in (this, that):
            process.terminate()
            process.wait()
        server.close()
    print(
        f"\n## This proxy vs {other} (64 clients, 128-token prompts, {rounds} rounds of "
        f"{seconds:g} s each, taking turns)\n"
    )
    print("| path | requests/s | ratio to direct | requests per CPU-second | ratio to direct |")
    print("|---|---:|---:|---:|---:|")
    for name in ("direct", "this", "other"):
        wall, cpu = rates[name]
        print(f"| {name} | {wall:.0f} | {wall / rates['direct'][0]:.3f} | {cpu:.0f} | {cpu / rates['direct'][1]:.3f} |")
    print(
        f"\nthis / other: {rates['this'][0] / rates['other'][0]:.2f}x requests/s, "
        f"{rates['this'][1] / rates['other'][1]:.2f}x requests per CPU-second"
    )
