"""Benchmark of the replica proxy: routing quality, added latency and requests/s.

    python benchmarks/proxy_bench.py            # full run (a few minutes on 2 cores)
    python benchmarks/proxy_bench.py --quick    # smaller workload, for a smoke check
    python benchmarks/proxy_bench.py --compare-with ../old-checkout   # A/B throughput

Part 1 replays a GRPO workload (many prompts x G=8, a shared system prompt, 15% of prompts
whose specific part is shorter than one block) through three policies: this router (fed the
real request bytes), round-robin, and a model of the reference policy (block-prefix affinity,
template blocks excluded, request-count load, spill when a replica has 8 more in flight than
the least loaded, a spill re-pins the blocks). Replicas are simulated: each has a prefix cache
(LRU of prompts plus the shared template) and token-proportional latency (prefill of uncached
tokens + decode slowed by the replica's batch), in simulated time, with 128 or 384 requests
kept in flight. Cold = the chosen replica had not seen the prompt. Imbalance = max/mean of
the work (prompt + completion tokens) routed to each replica. Prefill tokens/request = prompt
tokens the replicas had to compute because they were not in their prefix cache.

Part 2 measures the real proxy process, pinned to one core, against a minimal upstream:
p50/p99 latency added over calling the upstream directly (4k-token prompts, one request at a
time), and the most requests/s it forwards with 64 connections in flight, both per second of
wall clock and per CPU-second the proxy process used (the per-core capacity; robust when
other work shares the machine); with 64 clients and 128-token prompts also the direct path's
figures, so the proxy's throughput is a ratio to direct in the same run. `--compare-with`
runs only that, for this checkout's proxy and another checkout's (say a worktree of an older
commit) pinned to the same core, the three paths taking turns. The HTTP harness lives in
benchmarks/proxy_http.py. `--tenancy-ab` runs only the A/B of a proxy with --tenancy off and on (issue 43):
benchmarks/proxy_tenancy_ab.py.
"""

import argparse
import asyncio
import heapq
import json
import random
import sys
import time
from collections import OrderedDict, deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # part 2 lives beside this file

from agrpo.proxy.request_fields import parse_routing_fields
from agrpo.proxy.routing import Router
from proxy_http import compare, http_numbers

G, BLOCK, TEMPLATE_TOKENS = 8, 16, 150


# ---------------------------------------------------------------------------- part 1: policies
class OurPolicy:
    name = "agrpo"

    def __init__(self, replicas):
        self.router = Router()

    def route(self, body, ids, loads, inflight):
        d = self.router.route(parse_routing_fields(body), loads)
        return d.replica, d.kind


class RoundRobin:
    name = "round-robin"

    def __init__(self, replicas):
        self.replicas, self.next = replicas, 0

    def route(self, body, ids, loads, inflight):
        self.next = (self.next + 1) % self.replicas
        return self.next, "cold"


class ReferenceModel:
    """Block-prefix affinity learned at routing time; request-count load, spill at +8."""

    name = "reference"

    def __init__(self, replicas, imbalance=8):
        self.imbalance = imbalance
        self.owner: dict[int, tuple[int, int]] = {}  # block hash -> (replica, prompt) or shared

    def route(self, body, ids, loads, inflight):
        model = json.loads(body)["model"]
        chain, h = [], hash(model)
        for j in range(len(ids) // BLOCK):
            h = hash((h, tuple(ids[j * BLOCK : (j + 1) * BLOCK])))
            chain.append(h)
        prompt = hash(tuple(ids))
        target = None
        for h in reversed(chain):
            owner = self.owner.get(h)
            if owner is not None and owner[1] is not None:
                target = owner[0]
                break
        least = min(inflight, key=lambda r: (inflight[r], r))
        if target is None:
            chosen, kind = least, "cold"
        elif inflight[target] > inflight[least] + self.imbalance:
            chosen, kind = least, "spill"
        else:
            chosen, kind = target, "affinity"
        for h in chain:
            owner = self.owner.get(h)
            if owner is None or owner[1] == prompt:
                self.owner[h] = (chosen, prompt)
            elif owner[1] is not None:
                self.owner[h] = (owner[0], None)  # seen in two prompts: a template block
        return chosen, kind


# ---------------------------------------------------------------------------- part 1: simulation
def make_workload(num_prompts, rng):
    template = [rng.randrange(100, 30_000) for _ in range(TEMPLATE_TOKENS)]
    prompts = []
    for _ in range(num_prompts):
        if rng.random() < 0.15:
            length = rng.randint(1, BLOCK - 1)  # specific part shorter than one block
        else:
            length = min(1200, int(rng.lognormvariate(4.8, 0.8)) + BLOCK)
        prompts.append(template + [rng.randrange(100, 30_000) for _ in range(length)])
    bodies = [
        json.dumps(
            {"model": "trl-policy-v3", "prompt": p, "max_tokens": 768, "n": 1, "logprobs": 0, "return_token_ids": True}
        ).encode()
        for p in prompts
    ]
    completions = [[rng.randint(32, 768) for _ in range(G)] for _ in prompts]
    return prompts, bodies, completions


def simulate(policy, replicas, in_flight, workload):
    prompts, bodies, completions = workload
    cache = [OrderedDict() for _ in range(replicas)]
    template_seen = [False] * replicas
    loads = {r: 0.0 for r in range(replicas)}
    inflight = {r: 0 for r in range(replicas)}
    routed_work = [0.0] * replicas
    pending = deque((p, m) for p in range(len(prompts)) for m in range(G))
    events, now, seq = [], 0.0, 0
    cold = spills = total = prefill = 0

    def dispatch():
        nonlocal seq, cold, spills, total, prefill
        p, m = pending.popleft()
        ids = prompts[p]
        r, kind = policy.route(bodies[p], ids, loads, inflight)
        total += 1
        spills += kind == "spill"
        if p in cache[r]:
            cache[r].move_to_end(p)
            uncached = len(ids) % BLOCK
        else:
            cold += 1
            uncached = len(ids) - (TEMPLATE_TOKENS // BLOCK * BLOCK if template_seen[r] else 0)
            cache[r][p] = True
            if len(cache[r]) > 4096:
                cache[r].popitem(last=False)
        template_seen[r] = True
        prefill += uncached
        work = len(ids) + 768  # what the router accounts: prompt + max_tokens x n
        done = completions[p][m]
        loads[r] += work
        inflight[r] += 1
        routed_work[r] += len(ids) + done
        service = 0.005 + 0.0001 * uncached + 0.02 * done * (1 + inflight[r] / 64)
        seq += 1
        heapq.heappush(events, (now + service, seq, r, work))

    while pending and len(events) < in_flight:
        dispatch()
    while events:
        now, _, r, work = heapq.heappop(events)
        loads[r] -= work
        inflight[r] -= 1
        if pending:
            dispatch()
    mean = sum(routed_work) / replicas
    return {
        "cold": 100 * cold / total,
        "spills": 100 * spills / total,
        "imbalance": max(routed_work) / mean,
        "prefill": prefill / total,
    }


def routing_table(num_prompts, seed):
    rows = []
    for replicas in (2, 3, 4):
        for in_flight in (128, 384):
            for policy_cls in (OurPolicy, RoundRobin, ReferenceModel):
                workload = make_workload(num_prompts, random.Random(seed))
                result = simulate(policy_cls(replicas), replicas, in_flight, workload)
                rows.append((replicas, in_flight, policy_cls.name, result))
    return rows


# ---------------------------------------------------------------------------- report
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workload, short runs")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per simulation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-http", action="store_true", help="routing simulation only")
    parser.add_argument("--http-only", action="store_true", help="skip the routing simulation")
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="only compare this proxy's throughput with CHECKOUT's, in one run",
    )
    parser.add_argument("--rounds", type=int, default=6, help="turns per path (--compare-with, --tenancy-ab)")
    parser.add_argument(
        "--tenancy-ab", action="store_true", help="only the hot-path cost of --tenancy: off vs on, in one run"
    )
    args = parser.parse_args()
    if args.tenancy_ab:
        from proxy_tenancy_ab import report, tenancy_ab

        report(asyncio.run(tenancy_ab(2 if args.quick else args.rounds, 1.0 if args.quick else 3.0)))
        return
    if args.compare_with:
        asyncio.run(compare(args.compare_with.resolve(), args.rounds, 1.0 if args.quick else 2.0))
        return
    prompts = args.prompts or (300 if args.quick else 2000)
    started = time.time()
    if not args.http_only:
        print(f"## Routing ({prompts} prompts x G={G}; cold floor 1/G = {100 / G:.1f}%)\n")
        print("| replicas | in flight | policy | cold % | spills % | imbalance | prefill tokens/request |")
        print("|---:|---:|---|---:|---:|---:|---:|")
        for replicas, in_flight, name, r in routing_table(prompts, args.seed):
            print(
                f"| {replicas} | {in_flight} | {name} | {r['cold']:.2f} | {r['spills']:.2f} | "
                f"{r['imbalance']:.3f} | {r['prefill']:.0f} |"
            )
    if not args.skip_http:
        h = asyncio.run(http_numbers(args.quick))
        where = "pinned to one core" if h["one_core"] else "NOT pinned (one core available)"
        print(f"\n## Proxy process ({where}; uvloop when installed)\n")
        print("| metric | value | target |\n|---|---:|---:|")
        print(f"| p50 added latency, 4k-token prompts | {h['p50_added_ms']:.3f} ms | <= 1 ms |")
        print(f"| p99 added latency, 4k-token prompts | {h['p99_added_ms']:.3f} ms | |")
        for tokens in (256, 4096):
            wall, per_cpu = h[f"rps_{tokens}"]
            target = ">= 3000" if tokens == 256 else ""
            print(f"| max requests/s, {tokens}-token prompts (wall clock) | {wall:.0f} | |")
            print(f"| requests per CPU-second of the proxy, {tokens}-token prompts | {per_cpu:.0f} | {target} |")
        print(f"| requests/s direct, 64 clients, 128-token prompts | {h['rps_direct_128']:.0f} | |")
        print(f"| requests/s through the proxy, same clients | {h['rps_proxy_128']:.0f} | |")
        print(f"| proxy / direct ratio, 128-token prompts (wall clock) | {h['ratio_128']:.3f} | |")
        print(f"| requests per CPU-second, direct path (client + upstream) | {h['cpu_direct_128']:.0f} | |")
        print(f"| requests per CPU-second of the proxy, same clients | {h['cpu_proxy_128']:.0f} | |")
        print(f"| proxy / direct ratio per CPU-second, 128-token prompts | {h['cpu_ratio_128']:.3f} | |")
    print(f"\n(total {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
