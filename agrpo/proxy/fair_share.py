"""Fair share between the tenants of a shared fleet: per-tenant in-flight caps with a FIFO wait per tenant. Pure.

With `k` tenants that have requests waiting or in flight, each may hold `max(1, ceil(slots / k))` sequences in flight
(a request counts its `n`); `slots` is what the replicas run at once (the sum of their --max-num-seqs). A request over
its tenant's cap waits behind that tenant's earlier ones, and is admitted as soon as its own tenant is under the cap:
another tenant's burst only ever waits on itself. A tenant with nothing in flight is always admitted (a request larger
than the cap still runs, alone). Tickets are opaque (the proxy's are futures it resolves: tenant_gate.py).
"""

from __future__ import annotations

from collections import deque

from agrpo.proxy.tenants import fair_cap


class FairShare:
    """In-flight sequences and waiting tickets per tenant."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self.in_flight: dict[str, int] = {}
        self.waiting: dict[str, deque] = {}  # tenant -> deque of (ticket, n), oldest first

    def active(self) -> int:
        """Tenants with requests waiting or in flight (both dicts hold only those: a count of 0 or an empty queue is
        removed)."""
        if not self.waiting:
            return len(self.in_flight)
        return len(self.in_flight.keys() | self.waiting.keys())

    def _active(self, tenant: str) -> bool:
        return self.in_flight.get(tenant, 0) > 0 or bool(self.waiting.get(tenant))

    def cap(self, arriving: str | None = None) -> int:
        """The per-tenant cap now (counting `arriving` as active)."""
        active = self.active()
        if arriving is not None and not self._active(arriving):
            active += 1
        return fair_cap(self.slots, active)

    def _fits(self, tenant: str, n: int, cap: int) -> bool:
        held = self.in_flight.get(tenant, 0)
        return held == 0 or held + n <= cap

    def enter(self, tenant: str, n: int) -> bool:
        """True: admitted now (its `n` counted in flight); False: it must `wait` (nothing recorded yet)."""
        if tenant not in self.waiting and self._fits(tenant, n, self.cap(tenant)):
            self.in_flight[tenant] = self.in_flight.get(tenant, 0) + n
            return True
        return False

    def wait(self, tenant: str, n: int, ticket) -> None:
        """`ticket` waits behind its tenant's earlier ones; `leave`, `withdraw` or `resize` admits it."""
        self.waiting.setdefault(tenant, deque()).append((ticket, n))

    def arrive(self, tenant: str, n: int, ticket) -> bool:
        """`enter`, else `wait` with `ticket`."""
        if self.enter(tenant, n):
            return True
        self.wait(tenant, n, ticket)
        return False

    def leave(self, tenant: str, n: int) -> list:
        """A request of `tenant` ended: the tickets admitted now (their `n` counted in flight), oldest first."""
        held = self.in_flight.get(tenant, 0) - n
        if held > 0:
            self.in_flight[tenant] = held
        else:
            self.in_flight.pop(tenant, None)
        return self._admit_waiting()

    def withdraw(self, tenant: str, ticket) -> list:
        """A waiting ticket gave up (its client left): removed; the tickets that fewer active tenants admit now."""
        queue = self.waiting.get(tenant)
        if queue:
            for entry in list(queue):
                if entry[0] is ticket:
                    queue.remove(entry)
                    break
            if not queue:
                del self.waiting[tenant]
        return self._admit_waiting()

    def forget(self, tenant: str) -> list:
        """The tenant left the fleet: its waiting tickets (to refuse), and nothing of it is counted any more."""
        self.in_flight.pop(tenant, None)
        return [ticket for ticket, _ in self.waiting.pop(tenant, ())]

    def resize(self, slots: int) -> list:
        """The replicas changed: the new slot count, and the tickets a larger cap admits now."""
        self.slots = max(1, int(slots))
        return self._admit_waiting()

    def _admit_waiting(self) -> list:
        if not self.waiting:
            return []
        admitted = []
        cap = self.cap()  # admitting a waiting ticket never changes who is active
        for tenant in list(self.waiting):
            queue = self.waiting[tenant]
            while queue and self._fits(tenant, queue[0][1], cap):
                ticket, n = queue.popleft()
                self.in_flight[tenant] = self.in_flight.get(tenant, 0) + n
                admitted.append(ticket)
            if not queue:
                del self.waiting[tenant]
        return admitted
