"""Per-replica adapter availability: load a version everywhere, answer once one replica serves it.

`POST /v1/load_lora_adapter?serve=first` (what agrpo's background sync sends) starts the load on every healthy
replica at once and answers 200 as soon as one of them serves the adapter; the others go on loading in the
background. Meanwhile the proxy routes requests naming that adapter only to replicas that hold it
(`ReplicaSet.loads(model=...)`), so a slow replica gets no traffic it cannot serve and holds up nobody: it takes
requests for the new version once its own load is done, and less work overall because its outstanding work drains
slower. Without `serve=first` a load stays all-or-nothing (broadcast.py), as TRL's pausing sync expects.

A replica that fails its load (a hard failure, or the mount never shows the files before the deadline) after another
one served the adapter is taken out of rotation; the health probe re-admits it after replaying every loaded adapter,
as for a replica that died. If no replica serves it, the answer is the failure and nothing was loaded.

The transport and the bookkeeping are injected, so the rules are tested without sockets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from agrpo.proxy.broadcast import (
    LoadRetry,
    Outcome,
    Reply,
    Send,
    adapter_missing,
    error_outcome,
    serves_adapter,
)
from agrpo.proxy.replicas import Replica

SERVE_FIRST = "first"
DEADLINE_STATUS = 504


async def load_until_served(
    replica: Replica, body: bytes, send: Send, retry: LoadRetry, clock: Callable[[], float] = time.monotonic
) -> Reply:
    """One replica's load, retried with doubling waits while its mount does not show the adapter yet."""
    deadline_at = clock() + retry.deadline_s
    delay = retry.initial_s
    while True:
        reply = await send(replica, "POST", "/v1/load_lora_adapter", body)
        if serves_adapter(reply) or reply.status is None or not adapter_missing(reply):
            return reply
        remaining = deadline_at - clock()
        if remaining <= 0:
            return Reply(DEADLINE_STATUS, reply.body, reply.content_type, "deadline")
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, retry.max_s)


def _failure(name: str, replicas: Sequence[Replica], replies: Sequence[Reply], retry: LoadRetry) -> Outcome:
    """No replica serves the adapter: the answer names each replica's reason (hard failures first)."""
    pairs = list(zip(replicas, replies))
    answered = [(r, p) for r, p in pairs if p.status is not None]
    if not answered:
        details = "; ".join(f"replica {r.index}: {p.summary()}" for r, p in pairs)
        return error_outcome(502, f"no replica answered the load of {name!r}: {details}", "AdapterLoadError")
    hard = [(r, p) for r, p in answered if p.error != "deadline"]
    culprits = hard or answered
    details = "; ".join(
        f"replica {r.index} still found no adapter after {retry.deadline_s:g}s"
        if p.error == "deadline"
        else f"replica {r.index} answered {p.summary()}"
        for r, p in culprits
    )
    status = culprits[0][1].status if hard else DEADLINE_STATUS
    return error_outcome(status or 502, f"adapter {name!r} was loaded on no replica: {details}", "AdapterLoadError")


async def load_first(
    replicas: Sequence[Replica],
    name: str,
    body: bytes,
    send: Send,
    retry: LoadRetry,
    *,
    on_served: Callable[[Replica], Awaitable[None]],
    on_failed: Callable[[Replica, Reply], None],
    on_done: Callable[[], None] = lambda: None,
    tasks: set[asyncio.Task] | None = None,
) -> Outcome:
    """Start the load on every replica; return at the first that serves it. The other loads go on as tasks (kept in
    `tasks` so the server can cancel them at shutdown); each ends in `on_served` or, once some replica served the
    adapter, in `on_failed`. `on_done` runs when the last load ended, if any replica served the adapter."""
    if not replicas:
        return error_outcome(503, "no healthy replica to load the adapter on")
    tasks = tasks if tasks is not None else set()
    first = asyncio.get_running_loop().create_future()
    replies: dict[int, Reply] = {}
    early_failures: list[tuple[Replica, Reply]] = []  # failed before any replica served it
    state = {"served": 0, "left": len(replicas)}

    async def one(replica: Replica) -> None:
        reply = await load_until_served(replica, body, send, retry)
        replies[replica.index] = reply
        if serves_adapter(reply):
            await on_served(replica)
            state["served"] += 1
            if not first.done():
                first.set_result(True)
        elif state["served"]:
            on_failed(replica, reply)
        else:
            early_failures.append((replica, reply))
        state["left"] -= 1
        if state["left"] == 0:
            if not first.done():
                first.set_result(False)
            elif state["served"]:
                on_done()

    for replica in replicas:
        task = asyncio.create_task(one(replica))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if not await asyncio.shield(first):
        return _failure(name, replicas, [replies[r.index] for r in replicas], retry)
    for replica, reply in early_failures:
        on_failed(replica, reply)
    early_failures.clear()
    return Outcome(
        200, f"Success: LoRA adapter '{name}' added (served by {state['served']} replica(s) so far)".encode()
    )
