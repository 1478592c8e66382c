"""The hot-path cost of `--tenancy` (issue 43): the same proxy with tenancy off and on, one run, same core.

    python benchmarks/proxy_bench.py --tenancy-ab [--quick]

Both proxies run as processes pinned to the same core, in front of one minimal upstream (in this process, on the
other cores) that answers at once with a vLLM-shaped completion ending in its usage block. Off: today's single-run
proxy with --admin-token-env, the clients sending the admin token (as the trainer does). On: --tenancy, one tenant
registered, the clients sending its token and naming its adapter (`<tenant>/trl-policy-v3`), so every request pays
the identity check, the namespace check, the fair-share bookkeeping and the usage count. 64 keep-alive clients,
128-token prompts in GRPO groups; the two take turns `rounds` times. Printed: requests/s (wall clock) and requests
per CPU-second of the proxy process (what one core can do), with the on/off ratios.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from proxy_http import G, Client, body_length, cpu_seconds, free_port

ADMIN_ENV = "AGRPO_BENCH_ADMIN_TOKEN"
ADMIN = "bench-admin-token-0123456789abcdef"
ANSWER = json.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [{"index": 0, "text": "x" * 40, "token_ids": list(range(16)), "finish_reason": "length"}],
        "usage": {"prompt_tokens": 128, "total_tokens": 144, "completion_tokens": 16},
    }
).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)


class Upstream(asyncio.Protocol):
    """Answers every request at once with ANSWER."""

    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""

    def data_received(self, data):
        self.buffer += data
        while (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
            end = head_end + 4 + body_length(self.buffer[:head_end])
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            self.transport.write(RESPONSE)


def start(upstream_port: int, core, tenancy: bool):
    port = free_port()
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    flags = ["--upstream", f"http://127.0.0.1:{upstream_port}", "--port", str(port), "--log-level", "warning"]
    flags += ["--admin-token-env", ADMIN_ENV] + (["--tenancy"] if tenancy else [])
    process = subprocess.Popen(
        [sys.executable, "-m", "agrpo.proxy", *flags],
        cwd=Path(__file__).resolve().parents[1],
        preexec_fn=pin,
        stdout=subprocess.PIPE,
        env={**os.environ, ADMIN_ENV: ADMIN, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    return process, port


def register(port: int) -> tuple[str, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/fleet/tenants",
        data=json.dumps({"run": "bench", "lease_s": 3600, "versions": 4, "lora_rank": 8}).encode(),
        headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = json.loads(answer.read())
    return body["tenant"], body["token"]


def raw_requests(port: int, token: str, model: str, rng) -> list[bytes]:
    bodies = [
        json.dumps({"model": model, "max_tokens": 256, "n": 1, "prompt": [rng.randrange(150_000) for _ in range(128)]})
        for _ in range(512)
    ]
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += f"Authorization: Bearer {token}\r\n"
    raws = [(head + f"Content-Length: {len(b)}\r\n\r\n" + b).encode() for b in bodies]
    return [r for r in raws for _ in range(G)]


async def rate(port: int, raws: list[bytes], pid: int, seconds: float, connections: int = 64):
    """(requests/s of wall time, requests per CPU-second of the proxy process)."""
    loop = asyncio.get_running_loop()
    clients = [(await loop.create_connection(Client, "127.0.0.1", port))[1] for _ in range(connections)]
    done, stop_at = 0, time.perf_counter() + seconds

    async def drive(client, i):
        nonlocal done
        while time.perf_counter() < stop_at:
            status = await client.request(raws[i % len(raws)])
            assert status == 200, f"the proxy on port {port} answered {status}"
            done, i = done + 1, i + connections

    started, cpu_before = time.perf_counter(), cpu_seconds(pid)
    await asyncio.gather(*(drive(c, k) for k, c in enumerate(clients)))
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu_before
    for client in clients:
        client.transport.close()
    return done / wall, done / max(cpu, 1e-9)


async def tenancy_ab(rounds: int, seconds: float) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    core = cores[0] if len(cores) > 1 else None
    if core is not None:
        os.sched_setaffinity(0, set(cores[1:]))
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", 0)
    upstream_port = server.sockets[0].getsockname()[1]
    off, off_port = start(upstream_port, core, tenancy=False)
    on, on_port = start(upstream_port, core, tenancy=True)
    try:
        for process in (off, on):
            await asyncio.to_thread(process.stdout.readline)
        tenant, token = await asyncio.to_thread(register, on_port)
        rng = random.Random(0)
        arms = {
            "off": (off_port, off.pid, raw_requests(off_port, ADMIN, "trl-policy-v3", rng)),
            "on": (on_port, on.pid, raw_requests(on_port, token, f"{tenant}/trl-policy-v3", rng)),
        }
        runs = {name: [] for name in arms}
        for name, (port, pid, raws) in arms.items():  # warm up
            await rate(port, raws, pid, 0.5)
        for _ in range(rounds):
            for name, (port, pid, raws) in arms.items():
                runs[name].append(await rate(port, raws, pid, seconds))
    finally:
        for process in (off, on):
            process.terminate()
            process.wait()
        server.close()
    med = {name: tuple(statistics.median(r[k] for r in rs) for k in (0, 1)) for name, rs in runs.items()}
    return {"pinned": core is not None, "rounds": rounds, "seconds": seconds, **med}


def report(result: dict) -> None:
    where = "both pinned to one core" if result["pinned"] else "NOT pinned (one core available)"
    print(
        f"\n## --tenancy off vs on ({where}; 64 clients, 128-token prompts, medians of {result['rounds']} turns of "
        f"{result['seconds']:g} s each)\n"
    )
    print("| proxy | requests/s | requests per CPU-second |\n|---|---:|---:|")
    for name in ("off", "on"):
        wall, cpu = result[name]
        print(f"| tenancy {name} | {wall:.0f} | {cpu:.0f} |")
    (w_off, c_off), (w_on, c_on) = result["off"], result["on"]
    print(f"| on / off | {w_on / w_off:.3f} | {c_on / c_off:.3f} |")
