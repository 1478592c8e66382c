"""A replica's measured pace: routed work it finishes per second while it has work. Pure code, no I/O.

Why: the routing policy balanced outstanding work (prompt tokens + max_tokens x n), which assumes every replica
finishes work at the same rate. A replica held to a quarter of a core then held as much work as a healthy one and
returned it four times later, too late to train: with a straggler, 19-20% of all samples were dropped as stale
(issue 47). With each replica's pace the router compares the time a request would take to finish, not its tokens.

The pace is busy-time throughput: the work of answered requests over the seconds the replica had at least one
request in flight, both decayed with a half-life of `HALF_LIFE_S` busy seconds, so a replica that slows down (or
recovers) is seen within seconds while one idle replica keeps its last figure. Until `MIN_ANSWERS` answers and
`MIN_BUSY_S` busy seconds are in, the pace is unknown and the router treats the replica as the fastest one: a new
replica gets traffic, and with no measurement at all routing is exactly the work-balanced policy of before.
"""

from __future__ import annotations

HALF_LIFE_S = 20.0  # busy seconds after which an old measurement weighs half
MIN_ANSWERS = 4  # answers before the pace is trusted (the first requests with logprobs warm the server up)
MIN_BUSY_S = 1.0
LATENCY_WEIGHT = 0.25  # of the newest answer in the moving average of answer times


class Pace:
    """Decayed work done / busy seconds of one replica. `begin` and `end` are called as requests start and end,
    with the event loop's clock."""

    __slots__ = ("work", "busy_s", "answers", "latency_s", "answered_at", "_inflight", "_since")

    def __init__(self) -> None:
        self.work = 0.0
        self.busy_s = 0.0
        self.answers = 0
        self.latency_s: float | None = None  # recent answers' time from routing to answer (a moving average)
        self.answered_at: float | None = None  # when the last answer came back
        self._inflight = 0
        self._since: float | None = None  # when the busy time was last accounted for

    def begin(self, now: float) -> None:
        self._account(now)
        self._inflight += 1

    def end(self, work: float, now: float, answered: bool = True, took_s: float | None = None) -> None:
        """A request ended after `took_s`; its work counts only when the replica answered it (an aborted or failed
        request's partial work is unknown, its busy time still counts)."""
        self._account(now)
        self._inflight = max(0, self._inflight - 1)
        if answered:
            self.work += work
            self.answers += 1
            if took_s is not None:
                old = self.latency_s
                self.latency_s = took_s if old is None else old + LATENCY_WEIGHT * (took_s - old)
                self.answered_at = now

    @property
    def idle(self) -> bool:
        return self._inflight == 0

    @property
    def rate(self) -> float | None:
        """Work per busy second, or None while too little was measured."""
        if self.answers < MIN_ANSWERS or self.busy_s < MIN_BUSY_S or self.work <= 0:
            return None
        return self.work / self.busy_s

    def _account(self, now: float) -> None:
        if self._since is not None and self._inflight > 0:
            busy = max(0.0, now - self._since)
            keep = 0.5 ** (busy / HALF_LIFE_S)
            self.work *= keep
            self.busy_s = self.busy_s * keep + busy
        self._since = now


def relative_paces(rates: dict[int, float | None]) -> dict[int, float]:
    """Each replica's pace as a share of the fastest measured one (1.0 for the fastest and for any not measured
    yet): the router divides work by it, so with equal or unknown paces its figures are the plain work."""
    known = [r for r in rates.values() if r]
    fastest = max(known, default=0.0)
    if fastest <= 0:
        return {index: 1.0 for index in rates}
    return {index: (rate / fastest if rate else 1.0) for index, rate in rates.items()}
