"""The slow-body attack of issue 30 against the real proxy process, with its default limits, over loopback.

    python benchmarks/proxy_slow_body.py [--seconds 20] [--checkout PATH] [--attackers 4]

Four attacking connections each declare a 64 MiB body (--max-body-bytes), send all of it but the last byte and
wait; whenever the proxy closes one (408, 503) it reconnects at once. Meanwhile, every 0.5 s, four clients make one
request each: the trainer's completion and adapter load (with the admin token), a completion without the token from
the attacker's address (127.0.0.1), and a 1.2 MB completion from another address (127.0.0.2). Prints each one's
statuses and latencies. The replica is a minimal in-process upstream (no vLLM: nothing here reaches one); the proxy is
`python -m agrpo.proxy` from this checkout, or from --checkout (e.g. main before the fix). Bounded: --seconds of
attack, at most 400 connections per attacker.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

MIB = 1024 * 1024
HUGE = 64 * MIB
TOKEN = "bench-admin-token"
COMPLETION = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}


async def upstream() -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m"}]})
        if request.path in ("/v1/completions", "/v1/load_lora_adapter", "/health"):
            return web.json_response({"choices": [{"text": "ok"}]})
        return web.json_response({}, status=404)

    app = web.Application(client_max_size=128 * MIB)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_proxy(upstream_url: str, port: int, checkout: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(checkout), "AGRPO_PROXY_ADMIN_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "agrpo.proxy", "--port", str(port), "--upstream", upstream_url]
    argv += ["--admin-token-env", "AGRPO_PROXY_ADMIN_TOKEN", "--log-level", "warning"]
    return subprocess.Popen(argv, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def attacker(port: int, deadline: float, closes: list, delay: float) -> None:
    """One attacking slot (a thread of the attacking process: its copies never slow the measuring clients' event
    loop), starting after `delay` (slot after slot, as the issue's attack: together they would split the budget)."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % HUGE
    body = memoryview(b"{" + b" " * (HUGE - 2))
    time.sleep(delay)
    for _ in range(400):
        if time.monotonic() >= deadline:
            return
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                sock.sendall(head)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.sendall(body)
                closes.append(sock.recv(64)[9:12] or b"eof")
        except TimeoutError:
            closes.append(b"held")  # held until the end
        except OSError:
            closes.append(b"reset")


def attack(port: int, seconds: float, attackers: int, nice: int, conn) -> None:
    """The attacking process: `attackers` slots for `seconds`; sends back what ended each connection."""
    os.nice(nice)
    deadline, closes = time.monotonic() + seconds, []
    slots = [threading.Thread(target=attacker, args=(port, deadline, closes, 2.0 * i)) for i in range(attackers)]
    for slot in slots:
        slot.start()
    for slot in slots:
        slot.join()
    conn.send(closes)


async def timed(session: ClientSession, url: str, record: list, **kwargs) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, **kwargs) as response:
            await response.read()
            record.append((response.status, time.perf_counter() - started))
    except Exception as err:  # noqa: BLE001 - a benchmark reports every outcome
        record.append((type(err).__name__, time.perf_counter() - started))


async def measure(port: int, seconds: float, attackers: int, nice: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    results = {"trainer completion": [], "trainer adapter load": [], "no-token completion": [], "other address": []}
    timeout = ClientTimeout(total=120)
    big = json.dumps({**COMPLETION, "prompt": [7] * 200_000}).encode()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        ClientSession(timeout=timeout) as local,
        ClientSession(timeout=timeout, connector=TCPConnector(local_addr=("127.0.0.2", 0))) as other,
    ):
        ours, theirs = multiprocessing.Pipe()
        attacking = multiprocessing.Process(
            target=attack, args=(port, seconds + 2.0 * attackers + 3.0, attackers, nice, theirs)
        )
        attacking.start()
        await asyncio.sleep(2.0 * attackers + 1.0)  # the attack takes hold
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            load = {"lora_name": f"v{i}", "lora_path": f"/a/v{i}"}
            await asyncio.gather(
                timed(local, url + "/v1/completions", results["trainer completion"], json=COMPLETION, headers=auth),
                timed(local, url + "/v1/load_lora_adapter", results["trainer adapter load"], json=load, headers=auth),
                timed(local, url + "/v1/completions", results["no-token completion"], json=COMPLETION),
                timed(other, url + "/v1/completions", results["other address"], data=big),
            )
            i += 1
            await asyncio.sleep(0.5)
        closes = await asyncio.get_running_loop().run_in_executor(None, ours.recv)
        attacking.join()
    results["attacker connections closed"] = closes
    return results


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(results: dict) -> None:
    closes = results.pop("attacker connections closed")
    for name, record in results.items():
        statuses = [s for s, _ in record]
        latencies = [t for _, t in record]
        ok = statuses.count(200)
        print(
            f"{name:22s} {ok}/{len(record)} answered 200; statuses {sorted(set(map(str, statuses)))}; "
            f"latency median {statistics.median(latencies):.3f} s, max {max(latencies):.3f} s"
        )
    ends = {end.decode(): closes.count(end) for end in sorted(set(closes))}
    print(f"attacking connections: {len(closes)}, ended by {ends}")


async def main(seconds: float, checkout: Path, attackers: int, nice: int) -> None:
    runner = await upstream()
    upstream_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    port = free_port()
    proxy = start_proxy(upstream_url, port, checkout)
    try:
        async with ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                await asyncio.sleep(0.1)
        cpu = cpu_seconds(proxy.pid)
        started = time.monotonic()
        results = await measure(port, seconds, attackers, nice)
        report(results)
        print(f"proxy CPU: {cpu_seconds(proxy.pid) - cpu:.1f} s over {time.monotonic() - started:.1f} s")
    finally:
        proxy.terminate()
        proxy.wait(10)
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--attackers", type=int, default=4, help="attacking connections (0: the baseline)")
    parser.add_argument(
        "--attacker-nice",
        type=int,
        default=0,
        help="nice increment of the attacking process: on a small shared machine its copying competes for the CPU "
        "with everything else, which no proxy policy changes; a high value measures the proxy's policy alone",
    )
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.checkout, args.attackers, args.attacker_nice))
