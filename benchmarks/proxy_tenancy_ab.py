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
import urllib.request

from proxy_http import G, MinimalUpstream, raw_rate, request_bytes, start_proxy

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


class Upstream(MinimalUpstream):
    """Answers every request at once with ANSWER."""

    response = RESPONSE


def start(upstream_port: int, core, tenancy: bool):
    flags = ["--admin-token-env", ADMIN_ENV] + (["--tenancy"] if tenancy else [])
    return start_proxy(upstream_port, core, flags=flags, env={ADMIN_ENV: ADMIN})


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
    raws = [request_bytes(b.encode(), port, token) for b in bodies]
    return [r for r in raws for _ in range(G)]


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
            await raw_rate(port, raws, pid, 0.5)
        for _ in range(rounds):
            for name, (port, pid, raws) in arms.items():
                runs[name].append(await raw_rate(port, raws, pid, seconds))
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
