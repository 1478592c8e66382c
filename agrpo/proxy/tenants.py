"""The runs sharing one fleet (issue 43), as pure state: who they are, their leases, their rights and their cost.

No I/O and no clock of its own (every call takes `now`), so the rules are tested without sockets: a tenant's token is
compared in constant time, a tenant touches only `<tenant>/...` adapters, a fleet that has no room says so at
registration, and the fleet's replica-seconds go to the tenants in proportion to the tokens generated for them.
The HTTP side is agrpo/proxy/tenant_routes.py (routes, lease expiry) and tenant_gate.py (the routed path).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass, field

from agrpo.proxy.tenant_names import tenant_id, tenant_of

PAUSE_REFUSED = (
    "a shared fleet is never paused by one run: use sync.mode=background (only the fleet's admin token may pause, "
    "resume, reset the prefix cache, sleep or change the replicas)"
)


class NoRoom(Exception):
    """The fleet cannot take this tenant (409): the message names the knob to change."""


@dataclass
class Tenant:
    """One run on the fleet; counters are what its summary reports."""

    id: str
    run: str
    digest: bytes = field(repr=False)  # sha256 of the token: the token itself is never kept
    lease_s: float
    versions: int
    lora_rank: int
    registered_at: float  # unix seconds
    expires_at: float  # on the registry's clock
    in_flight: int = 0  # sequences (a request's n) admitted and not yet answered
    request_count: int = 0  # completions it sent ("requests" in the JSON)
    tokens: int = 0
    tick_tokens: int = 0  # tokens since the last attribution tick
    replica_seconds: float = 0.0
    gate_waiters: int = 0  # its requests waiting at the fair-share gate now
    gate_since: float = 0.0  # when the first of them began to wait (the registry's clock)
    gate_done_s: float = 0.0  # seconds with at least one request waiting, up to gate_since

    def gate_enter(self, now: float) -> None:
        """A request of this run begins to wait for its fair share."""
        if self.gate_waiters == 0:
            self.gate_since = now
        self.gate_waiters += 1

    def gate_leave(self, now: float) -> None:
        """A waiting request was admitted, refused or withdrawn."""
        self.gate_waiters = max(0, self.gate_waiters - 1)
        if self.gate_waiters == 0:
            self.gate_done_s += max(0.0, now - self.gate_since)

    def gate_wait_s(self, now: float) -> float:
        """Seconds during which at least one of its requests waited at the fair-share gate (however many did: a
        time, not a sum of waits, so it compares with the run's own step time; agrpo/fleet/signals.py)."""
        running = max(0.0, now - self.gate_since) if self.gate_waiters else 0.0
        return self.gate_done_s + running

    def entry(self, adapters: list[str], now: float) -> dict:
        return {
            "tenant": self.id,
            "run": self.run,
            "adapters": adapters,
            "in_flight": self.in_flight,
            "requests": self.request_count,
            "tokens": self.tokens,
            "replica_seconds": round(self.replica_seconds, 3),
            "gate_wait_s": round(self.gate_wait_s(now), 3),
            "registered_at": self.registered_at,
            "lease_expires_in_s": round(max(0.0, self.expires_at - now), 3),
        }


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value, or None."""
    if not authorization:
        return None
    scheme, _, presented = authorization.strip().partition(" ")
    return presented.strip() if scheme.lower() == "bearer" and presented.strip() else None


class TenantRegistry:
    """The tenants of one fleet and its capacity: `max_tenants` runs, `lora_slots` adapters in all (0: unchecked),
    LoRA rank up to `max_lora_rank` (0: unchecked)."""

    def __init__(self, max_tenants: int, lora_slots: int = 0, max_lora_rank: int = 0):
        self.max_tenants = max_tenants
        self.lora_slots = lora_slots
        self.max_lora_rank = max_lora_rank
        self.tenants: dict[str, Tenant] = {}
        self._by_digest: dict[bytes, Tenant] = {}
        self._counter = 0
        self.replica_seconds = 0.0  # the fleet's total since start
        self.idle_replica_seconds = 0.0  # seconds in which no tenant got a token
        self.replicas = 0  # in rotation at the last tick

    def room_problem(self, versions: int, lora_rank: int) -> str | None:
        """Why one more tenant with `versions` adapters of rank `lora_rank` does not fit, or None."""
        knob = "`agrpo fleet up ... inference.shared.max_tenants=N`"
        if len(self.tenants) >= self.max_tenants:
            return (
                f"the fleet already serves {len(self.tenants)} run(s), its max_tenants: start it with a larger "
                f"{knob}, or wait for a run to end"
            )
        if self.max_lora_rank and lora_rank > self.max_lora_rank:
            return (
                f"this run's LoRA rank {lora_rank} exceeds the fleet's max_lora_rank {self.max_lora_rank}: lower "
                "lora.r or start a fleet for this rank"
            )
        held = sum(t.versions for t in self.tenants.values())
        if self.lora_slots and held + versions > self.lora_slots:
            return (
                f"the replicas were started with {self.lora_slots} LoRA slots (--max-loras) and the runs on the fleet "
                f"hold up to {held}: this run's {versions} more do not fit; start the fleet with a larger {knob} "
                "(the slots follow it) or a lower trainer.max_staleness"
            )
        return None

    def register(self, run: str, lease_s: float, versions: int, lora_rank: int, now: float, wall: float):
        """(tenant, its token): the token is returned once and only its digest is kept. NoRoom when it does not fit."""
        problem = self.room_problem(versions, lora_rank)
        if problem is not None:
            raise NoRoom(problem)
        self._counter += 1
        token = secrets.token_urlsafe(32)
        tenant = Tenant(
            id=tenant_id(self._counter, run),
            run=str(run),
            digest=token_digest(token),
            lease_s=float(lease_s),
            versions=int(versions),
            lora_rank=int(lora_rank),
            registered_at=wall,
            expires_at=now + float(lease_s),
        )
        self.tenants[tenant.id] = tenant
        self._by_digest[tenant.digest] = tenant
        return tenant, token

    def who(self, authorization: str | None) -> Tenant | None:
        """The tenant whose token this is, or None. The lookup is by the token's sha256 (which reveals nothing about
        the token through timing) and confirmed with a constant-time compare."""
        token = bearer(authorization)
        if token is None:
            return None
        digest = token_digest(token)
        tenant = self._by_digest.get(digest)
        if tenant is None or not hmac.compare_digest(tenant.digest, digest):
            return None
        return tenant

    def renew(self, tenant: Tenant, now: float) -> float:
        tenant.expires_at = now + tenant.lease_s
        return tenant.lease_s

    def expired(self, now: float) -> list[Tenant]:
        return [t for t in self.tenants.values() if t.expires_at <= now]

    def remove(self, tenant_id_: str) -> Tenant | None:
        tenant = self.tenants.pop(tenant_id_, None)
        if tenant is not None:
            self._by_digest.pop(tenant.digest, None)
        return tenant

    def tick(self, replicas: int, dt: float) -> None:
        """Attribute the last `dt` seconds of `replicas` replicas to the tenants by the tokens they got meanwhile."""
        self.replicas = replicas
        got = {t.id: t.tick_tokens for t in self.tenants.values()}
        shares, idle = attribute(got, replicas * max(0.0, dt))
        for tenant in self.tenants.values():
            tenant.replica_seconds += shares.get(tenant.id, 0.0)
            tenant.tick_tokens = 0
        self.replica_seconds += replicas * max(0.0, dt)
        self.idle_replica_seconds += idle

    def totals(self) -> dict:
        return {
            "replica_seconds": round(self.replica_seconds, 3),
            "replicas": self.replicas,
            "idle_replica_seconds": round(self.idle_replica_seconds, 3),
        }


def attribute(tokens: dict[str, int], replica_seconds: float) -> tuple[dict[str, float], float]:
    """({tenant: its share of `replica_seconds`}, idle): in proportion to tokens; all idle when nobody got one."""
    total = sum(n for n in tokens.values() if n > 0)
    if total <= 0:
        return {}, replica_seconds
    return {name: replica_seconds * n / total for name, n in tokens.items() if n > 0}, 0.0


def adapter_refusal(tenant: Tenant, name: str | None, action: str) -> str | None:
    """Why `tenant` may not load or unload adapter `name` (None: it may)."""
    if name is not None and tenant_of(name) == tenant.id:
        return None
    return (
        f"tenant {tenant.id} may {action} only adapters named '{tenant.id}/...' (its namespace on this shared fleet), "
        f"not {name!r}: serve this run's adapters as '{tenant.id}/trl-policy-vN'"
    )


def model_refusal(tenant: Tenant, model: str, loaded: dict | set) -> str | None:
    """Why `tenant` may not ask for `model` (None: it may): its own adapters and the base model only, never another
    run's adapter nor one the fleet's admin loaded outside every namespace."""
    if model.startswith(tenant.id) and model[len(tenant.id) : len(tenant.id) + 1] == "/":  # its own: the usual case
        return None
    owner = tenant_of(model)
    if owner is None and model not in loaded:
        return None
    return (
        f"tenant {tenant.id} may ask only for its own adapters ('{tenant.id}/...') or the base model on this shared "
        f"fleet, not {model[:200]!r}"
    )


def fair_cap(slots: int, active: int) -> int:
    """Sequences one tenant may hold in flight while `active` tenants have requests waiting or in flight."""
    return max(1, math.ceil(slots / max(1, active)))
