"""State changes sent to every replica, all-or-nothing, with honest reports.

The transport is injected (`send(replica, method, path_qs, body) -> Reply`), so these rules are
tested without sockets: a policy name must never end up loaded on only some replicas, and
pause/resume must leave every replica in the same state.
"""

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from agrpo.proxy.replicas import Replica


@dataclass(frozen=True, slots=True)
class Reply:
    """What one replica answered; `status` None means no HTTP answer (connection, timeout)."""

    status: int | None
    body: bytes = b""
    content_type: str = "application/json"
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def summary(self, limit: int = 300) -> str:
        if self.status is None:
            return f"no answer ({self.error})"
        text = self.body.decode("utf-8", "replace").strip()
        try:
            text = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            try:
                text = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                pass
        text = str(text)
        if len(text) > limit:
            text = text[:limit] + "..."
        return f"HTTP {self.status}: {text}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The proxy's single answer to a broadcast."""

    status: int
    body: bytes
    content_type: str = "application/json"
    silent: tuple[int, ...] = ()  # replicas that gave no answer to a failed load: it may still land on them

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


Send = Callable[[Replica, str, str, bytes], Awaitable[Reply]]

_DEADLINE = 504


def error_outcome(status: int, message: str, kind: str = "ProxyError") -> Outcome:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return Outcome(status, json.dumps(body).encode())


def adapter_missing(reply: Reply) -> bool:
    """vLLM's answer when the adapter path does not exist (yet) on that replica's disk."""
    return reply.status == 404 and b"No adapter found" in reply.body


def already_loaded(reply: Reply) -> bool:
    """vLLM's 400 for a name it already serves. Adapter names are versioned (trl-policy-vN), so the same name is the
    same weights: a repeated load (a client retrying after its own timeout, a replay) has nothing left to do."""
    return reply.status == 400 and b"has already been loaded" in reply.body


def serves_adapter(reply: Reply) -> bool:
    """After this answer to a load the replica serves the adapter: it loaded it now, or already had it."""
    return reply.ok or already_loaded(reply)


def _name(replica: Replica) -> str:
    return f"replica {replica.index} ({replica.url})"


def _names(replicas: Sequence[Replica]) -> str:
    return ", ".join(str(r.index) for r in replicas)


def answered(replicas: Sequence[Replica], replies: Sequence[Reply]) -> tuple[list[Replica], list[Reply]]:
    """The replicas that gave an HTTP answer, with their replies. One that gave none (connection refused or reset,
    timeout) is down: the control plane takes it out of rotation and re-synchronises it (adapters, pause) before it
    takes traffic again, so it must not veto a state change the others made. All-or-nothing holds among the rest."""
    pairs = [(r, p) for r, p in zip(replicas, replies) if p.status is not None]
    return [r for r, _ in pairs], [p for _, p in pairs]


DROPPED = "dropped"  # the error of a Reply given up on because its replica was marked unhealthy meanwhile


def abandoned_when_down(send: Send) -> Send:
    """`send`, except that a replica marked unhealthy while its answer is awaited (`Replica.down`: the health probe
    got no answer, or it refused a connection) is given up on at once. The answer is then `Reply(None)`, which every
    broadcast here treats as no answer (`answered`): a hung replica neither vetoes nor blocks the state change of the
    healthy ones, and a load it may still complete later is handled like any unanswered one (`Outcome.silent`). A
    send to a replica that is already marked unhealthy when it starts (the state replay that re-admits it) is awaited
    in full."""

    async def send_unless_down(replica: Replica, method: str, path_qs: str, body: bytes) -> Reply:
        if replica.down.is_set():
            return await send(replica, method, path_qs, body)
        answer = asyncio.ensure_future(send(replica, method, path_qs, body))
        down = asyncio.ensure_future(replica.down.wait())
        try:
            await asyncio.wait((answer, down), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller was cancelled (shutdown): nothing is left waiting
            answer.cancel()
            raise
        finally:
            down.cancel()
        if answer.done():
            return answer.result()
        answer.cancel()
        return Reply(None, error=f"{DROPPED}: marked unhealthy while its answer was awaited ({replica.last_error})")

    return send_unless_down


def _none_answered(replicas: Sequence[Replica], replies: Sequence[Reply], what: str) -> Outcome:
    details = "; ".join(f"{_name(r)}: {p.summary()}" for r, p in zip(replicas, replies))
    return error_outcome(502, f"no replica answered {what}: {details}")


def _success(replies: Sequence[Reply]) -> Outcome:
    first = replies[0]
    return Outcome(first.status or 200, first.body, first.content_type)


def _failure_status(reply: Reply) -> int:
    """The status the client gets for a replica's failure: its own error status, else 502 (no answer, or a 3xx:
    redirects are never followed, so a redirect is a replica not doing what it was asked)."""
    return reply.status if reply.status is not None and reply.status >= 400 else 502


@dataclass(frozen=True)
class LoadRetry:
    """How long a replica whose mount has not caught up is retried (values: ProxySettings.load_retry_*)."""

    deadline_s: float
    initial_s: float
    max_s: float


async def load_adapter(
    replicas: Sequence[Replica],
    body: bytes,
    send: Send,
    retry: LoadRetry,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Load on every replica or on none: roll back the accepted ones on any failure."""
    if not replicas:
        return error_outcome(503, "no healthy replica to load the adapter on")
    deadline_at = clock() + retry.deadline_s
    abort = asyncio.Event()

    async def until_loaded(replica: Replica) -> Reply:
        delay = retry.initial_s
        while True:
            reply = await send(replica, "POST", "/v1/load_lora_adapter", body)
            if serves_adapter(reply) or abort.is_set() or reply.status is None:  # no answer: down, not a veto
                return reply
            if not adapter_missing(reply):
                abort.set()  # a real failure: stop the others from retrying
                return reply
            remaining = deadline_at - clock()
            if remaining <= 0:
                abort.set()
                return Reply(_DEADLINE, reply.body, reply.content_type, "deadline")
            try:
                await asyncio.wait_for(abort.wait(), min(delay, remaining))
            except asyncio.TimeoutError:
                pass
            delay = min(delay * 2, retry.max_s)

    all_replies = await asyncio.gather(*(until_loaded(r) for r in replicas))
    up, replies = answered(replicas, all_replies)
    if not up:
        return _none_answered(replicas, all_replies, "the adapter load")
    name = _adapter_name(body)
    if all(serves_adapter(reply) for reply in replies):
        fresh = [reply for reply in replies if reply.ok]
        return _success(fresh) if fresh else Outcome(200, f"Success: LoRA adapter '{name}' already loaded".encode())
    return await _undo_load(replicas, all_replies, name, send, retry)


async def _undo_load(
    replicas: Sequence[Replica], replies: Sequence[Reply], name: str, send: Send, retry: LoadRetry
) -> Outcome:
    """The load failed somewhere: unload it from the replicas that accepted it, and say what each replica holds. One
    that gave no answer (timed out) may still complete the load later: it is out of rotation, and the outcome names it
    (`silent`) so that the control plane unloads the version from it before re-admitting it."""
    hard = [p for p in replies if p.status is not None and not serves_adapter(p) and _hard_failure(p)]
    status = _failure_status(hard[0]) if hard else _DEADLINE
    undo = [r for r, p in zip(replicas, replies) if p.ok]
    undo_body = json.dumps({"lora_name": name}).encode()
    undone = dict(
        zip(undo, await asyncio.gather(*(send(r, "POST", "/v1/unload_lora_adapter", undo_body) for r in undo)))
    )
    states = [_held_after_undo(r, p, undone.get(r), retry) for r, p in zip(replicas, replies)]
    stuck = [r for r, p in zip(replicas, replies) if p.ok and not undone[r].ok]
    message = f"adapter {name!r} was not loaded on every replica, so it is served by none: " + "; ".join(states)
    if stuck:
        message += f". Replica(s) {_names(stuck)} still hold it: their state is inconsistent until it is unloaded"
    silent = tuple(r.index for r, p in zip(replicas, replies) if p.status is None)
    return replace(error_outcome(status, message, "AdapterLoadError"), silent=silent)


def _hard_failure(reply: Reply) -> bool:
    """A refusal that stopped the load, as opposed to a replica still waiting for its mount or out of time."""
    return reply.error != "deadline" and not adapter_missing(reply)


def _held_after_undo(replica: Replica, reply: Reply, undo: Reply | None, retry: LoadRetry) -> str:
    """What one replica holds after a failed load, in words."""
    who = _name(replica)
    if already_loaded(reply):
        return f"{who} already had it before this call and keeps it"
    if reply.ok:
        if undo is not None and undo.ok:
            return f"{who} loaded it; unloaded it again"
        return f"{who} loaded it, but the unload FAILED ({undo.summary() if undo else 'not sent'})"
    if reply.status is None:
        return (
            f"{who} gave no answer ({reply.error}): it is out of rotation, and should its load land late it is "
            "unloaded before the replica serves again"
        )
    if reply.error == "deadline":
        return f"{who} still found no adapter after {retry.deadline_s:g}s"
    if adapter_missing(reply):
        return f"{who} had not found the adapter yet (stopped)"
    return f"{who} answered {reply.summary()}"


@dataclass
class _Split:
    """A broadcast's replies once it is not settled by them: the replicas that confirmed, those that refused (with
    the reply), and the refusals in words."""

    confirmed: list[Replica]
    failed: list[tuple[Replica, Reply]]

    @property
    def details(self) -> str:
        return "; ".join(f"{_name(r)} answered {p.summary()}" for r, p in self.failed)

    @property
    def status(self) -> int:
        return _failure_status(self.failed[0][1])


async def _to_every_replica(
    replicas: Sequence[Replica], method: str, path_qs: str, body: bytes, send: Send, what: str, no_replica: str
) -> Outcome | _Split:
    """Send to every replica at once. The Outcome when the replies settle it (no replica to send to, none answered,
    every one that answered confirmed), else how they split."""
    if not replicas:
        return error_outcome(503, no_replica)
    all_replies = await asyncio.gather(*(send(r, method, path_qs, body) for r in replicas))
    up, replies = answered(replicas, all_replies)
    if not up:
        return _none_answered(replicas, all_replies, what)
    failed = [(r, p) for r, p in zip(up, replies) if not p.ok]
    if not failed:
        return _success(replies)
    return _Split([r for r, p in zip(up, replies) if p.ok], failed)


async def unload_adapter(replicas: Sequence[Replica], body: bytes, send: Send) -> Outcome:
    """Unload everywhere; any replica that did not confirm makes the answer a failure."""
    what, none = "the adapter unload", "no healthy replica to unload the adapter from"
    sent = await _to_every_replica(replicas, "POST", "/v1/unload_lora_adapter", body, send, what, none)
    if isinstance(sent, Outcome):
        return sent
    message = f"adapter {_adapter_name(body)!r} was not unloaded everywhere: {sent.details}"
    if sent.confirmed:
        message += f" (unloaded from replica(s) {_names(sent.confirmed)})"
    return error_outcome(sent.status, message, "AdapterUnloadError")


async def everywhere_or_undo(
    replicas: Sequence[Replica],
    path_qs: str,
    body: bytes,
    send: Send,
    undo_path_qs: str,
) -> Outcome:
    """Pause or resume all replicas; if some fail, send `undo_path_qs` to those that obeyed."""
    sent = await _to_every_replica(replicas, "POST", path_qs, body, send, path_qs, f"no healthy replica for {path_qs}")
    if isinstance(sent, Outcome):
        return sent
    message = f"{path_qs} failed on some replicas: {sent.details}"
    if sent.confirmed:
        undone = await asyncio.gather(*(send(r, "POST", undo_path_qs, b"") for r in sent.confirmed))
        stuck = [r for r, p in zip(sent.confirmed, undone) if not p.ok]
        message += f"; sent {undo_path_qs} to replica(s) {_names(sent.confirmed)} to undo it"
        if stuck:
            message += f", which FAILED on replica(s) {_names(stuck)}"
    return error_outcome(sent.status, message, "BroadcastError")


async def everywhere(
    replicas: Sequence[Replica],
    method: str,
    path_qs: str,
    body: bytes,
    send: Send,
) -> Outcome:
    """Send to all replicas (reset_prefix_cache, sleep, wake_up); report every failure."""
    sent = await _to_every_replica(replicas, method, path_qs, body, send, path_qs, f"no healthy replica for {path_qs}")
    if isinstance(sent, Outcome):
        return sent
    return error_outcome(sent.status, f"{path_qs} failed on some replicas: {sent.details}", "BroadcastError")


def _adapter_name(body: bytes) -> str:
    try:
        name = json.loads(body).get("lora_name")
    except (ValueError, AttributeError):
        return "?"
    return name if isinstance(name, str) else "?"
