"""Who may change the proxy's state, and how much memory requests may hold. No I/O here.

The admin token guards every call that changes what the replicas serve or which replicas
there are; the body budget bounds the bytes held by all requests in flight together, so many
large bodies at once get 503 instead of growing the process without limit, and decides who may
hold them, so that a few clients without the token cannot starve the rest (issue 30).
"""

import hmac
import os


class AdminGuard:
    """`Authorization: Bearer <token>` check, in constant time; open when no token is set."""

    def __init__(self, token: str | None):
        self._expected = token.encode("utf-8") if token else None

    @classmethod
    def from_env(cls, variable: str | None) -> "AdminGuard":
        if not variable:
            return cls(None)
        token = os.environ.get(variable, "").strip()
        if not token:
            raise ValueError(f"--admin-token-env {variable}: that environment variable is empty or unset")
        return cls(token)

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, authorization: str | None) -> bool:
        if self._expected is None:
            return True
        if not authorization:
            return False
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # compare_digest takes as long whatever the first differing byte is
        return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), self._expected)


# A body still arriving that has not received this many bytes for STALL_S seconds is stalled: when the budget is full,
# a newcomer from another address may take its bytes. Loopback and any usable network deliver 64 KiB well within a
# second; a client that withholds its last byte, or trickles a byte at a time, never does.
PROGRESS_BYTES = 65536
STALL_S = 1.0


# What a client without the admin token may ask of a replica through the proxy (the proxy's own /health, /metrics and
# /proxy/stats, and the routed completions, are served before this): the reads an OpenAI client makes, and tokenizing.
# Everything else (vLLM's /server_info, /openapi.json, /docs, /get_world_size, /is_paused, /collective_rpc, ...)
# needs the token, as the replica's key guards it behind the proxy: default-deny, like a gateway's route table.
OPEN_READS = frozenset(("/v1/models", "/version", "/ping"))
OPEN_POSTS = frozenset(("/tokenize", "/detokenize"))


def open_without_token(method: str, path: str) -> bool:
    """Whether `method path` may reach a replica without the admin token (OPTIONS: a CORS preflight of an open one)."""
    if method in ("GET", "HEAD", "OPTIONS") and path in OPEN_READS:
        return True
    return method in ("POST", "OPTIONS") and path in OPEN_POSTS


class BodyEvicted(Exception):
    """Raised in a body's reader when the budget took its bytes back for another request."""


class Hold:
    """The body bytes one request holds. `evict` (set by whoever reads the body) ends that request when the budget
    takes its bytes back for another one."""

    __slots__ = ("peer", "trusted", "held", "evict", "progress_at", "progress_bytes")

    def __init__(self, peer: str, trusted: bool, evict, now: float):
        self.peer = peer
        self.trusted = trusted
        self.held = 0
        self.evict = evict
        self.progress_at = now
        self.progress_bytes = 0


class BodyBudget:
    """Bytes of request bodies held at once (memory), and who may hold them.

    All requests together hold at most `limit`. Requests without the admin token (`trusted` False) hold at most
    `limit - reserved` together and `per_peer` per client address, so a few connections can never take what the
    run's own requests (which carry the token) need. When a body does not fit, bodies still arriving without the
    token make room, oldest first: any of them for a body that has just arrived whole, stalled ones (no
    PROGRESS_BYTES in STALL_S) of other addresses for a body still arriving. Holding bytes therefore needs sending
    them: a client that declares a large body and withholds its end holds nothing that anyone else needs. (Not the
    stalled bodies of the newcomer's own address: an attacker's connections would take turns cutting each other
    off, each turn a new body the proxy reads; measured, that churn alone took the trainer's loads from 0.2 s to
    0.9 s on a 2-core machine.) Pure: the caller passes the clock.
    """

    __slots__ = (
        "limit",
        "open_limit",
        "per_peer",
        "held",
        "open_held",
        "by_peer",
        "peak",
        "refused",
        "evicted",
        "_arriving",
    )

    def __init__(self, limit: int, reserved: int = 0, per_peer: int | None = None):
        self.limit = limit
        self.open_limit = limit - reserved
        self.per_peer = per_peer if per_peer is not None else limit
        self.held = 0
        self.open_held = 0
        self.by_peer: dict[str, int] = {}
        self.peak = 0
        self.refused = 0  # bodies turned away or cut off (evicted ones included)
        self.evicted = 0
        self._arriving: dict[Hold, None] = {}  # bodies still arriving without the token, oldest first

    def hold(self, peer: str | None, trusted: bool, evict=None, now: float = 0.0) -> Hold:
        """A new, empty hold for one request's body."""
        return Hold(peer or "", trusted, evict, now)

    def take(self, hold: Hold, size: int, complete: bool, now: float = 0.0) -> bool:
        """Add `size` received bytes to `hold` if they fit, making room as the class says; `complete`: the body has
        now arrived whole. False (and nothing taken): the request is to be refused."""
        if not self._fits(hold, size) and not self._make_room(hold, size, complete, now):
            self.refused += 1
            return False
        self._count(hold, size)
        hold.progress_bytes += size
        if hold.progress_bytes >= PROGRESS_BYTES or complete:
            hold.progress_at, hold.progress_bytes = now, 0
        if complete or hold.trusted:
            self._arriving.pop(hold, None)
        else:
            self._arriving.setdefault(hold, None)
        return True

    def release(self, hold: Hold) -> None:
        """Give back everything `hold` holds (again: nothing)."""
        self._arriving.pop(hold, None)
        self._count(hold, -hold.held)

    def _count(self, hold: Hold, size: int) -> None:
        hold.held += size
        self.held += size
        if not hold.trusted:
            self.open_held += size
            left = self.by_peer.get(hold.peer, 0) + size
            if left:
                self.by_peer[hold.peer] = left
            else:
                self.by_peer.pop(hold.peer, None)
        if self.held > self.peak:
            self.peak = self.held

    def _fits(self, hold: Hold, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        return hold.trusted or (
            self.open_held + size <= self.open_limit and self.by_peer.get(hold.peer, 0) + size <= self.per_peer
        )

    def _make_room(self, hold: Hold, size: int, complete: bool, now: float) -> bool:
        """Evict bodies still arriving without the token, oldest first, if that makes `size` fit (else none)."""
        over_total = self.held + size - self.limit
        over_open = 0 if hold.trusted else self.open_held + size - self.open_limit
        over_peer = 0 if hold.trusted else self.by_peer.get(hold.peer, 0) + size - self.per_peer
        victims = []
        for victim in self._arriving:
            if over_total <= 0 and over_open <= 0 and over_peer <= 0:
                break
            same_peer = victim.peer == hold.peer
            if victim is hold or not (complete or (not same_peer and now - victim.progress_at >= STALL_S)):
                continue
            if over_total > 0 or over_open > 0 or (over_peer > 0 and same_peer):
                victims.append(victim)
                over_total -= victim.held
                over_open -= victim.held
                over_peer -= victim.held if same_peer else 0
        if over_total > 0 or over_open > 0 or over_peer > 0:
            return False
        for victim in victims:
            self.release(victim)
            self.refused += 1
            self.evicted += 1
            if victim.evict is not None:
                victim.evict()
        return True


def over_budget_message(limit: int) -> str:
    """The 503 message when a request's body does not fit in the budget."""
    return (
        f"the proxy holds its limit of request bytes in flight ({limit} bytes, --max-inflight-body-bytes, "
        "of which requests without the admin token get a share and each client address a part); retry shortly"
    )


EVICTED_MESSAGE = (
    "the request body was still arriving when the proxy needed its bytes for a request that had arrived; "
    "send bodies without pausing, or retry shortly"
)
