"""Which replicas can answer a request while its answer can still be trained. Pure code, no I/O.

Why: routing by pace (pace.py) gives a slow replica work in proportion to its pace, but a replica four times slower
still returns each answer four times later, and once the trainer steps faster than that, every one of its answers
arrives stale: in the straggler benchmark it took 30% of the requests and 11% of all samples were dropped (issue 47).
Whether an answer is in time depends on how long a version lasts, which the proxy can see for itself:

* a version's *first request* marks when it began to be served (`seen`), and the gap between two versions' first
  requests is the *interval* (one optimizer step x weight_sync_steps);
* the trainer unloads a version once it is more than max_staleness versions behind (the proxy marks it retired), so
  first request -> retired is its *lifetime*, (max_staleness + 1) intervals;
* a sample is trained with the batch the trainer collects after it arrives; that batch is the next version's at the
  latest, or it is dropped. So an answer for version M is in time until `first request of M + lifetime - interval`.

A replica whose recent answers took longer than the time a request has left, and `SLOWER_BY` times longer than the
quickest replica's, is not given it (a cold request goes to another, a group's pinned prompt spills), unless no
replica would be in time (then routing is as before: the proxy never refuses work the trainer asked for). Two things
are kept as they were, each measured in the agent e2e run, where a late filter without them moved a quarter of the
continuations off the replica holding their prefix (continuation affinity 1.0 -> 0.76; 0.86 with the first alone):
replicas of one pace are not told apart (their answer times straddle a late request's deadline by chance, the second
condition), and a multi-turn continuation stays on the replica holding its prefix unless it is overloaded (the router,
agrpo/proxy/routing.py: elsewhere it would first be computed again, no sooner). An idle replica whose last answer is
older than `PROBE_AFTER_S` is always in time, so a replica that recovers is measured again. Until two versions were retired nothing is known and every
replica is in time.
"""

from __future__ import annotations

import re
import statistics
from collections import OrderedDict
from collections.abc import Container, Iterable

PROBE_AFTER_S = 5.0
SLOWER_BY = 1.5  # a replica is left out only when its answers take this much longer than the quickest replica's
KEEP = 8  # versions whose lifetimes and intervals are remembered (the median of them is used)


class VersionClock:
    """First requests and retirements of adapter versions, and the time an answer has left."""

    def __init__(self) -> None:
        self.first_seen: OrderedDict[str, float] = OrderedDict()  # served names not retired yet
        self.lifetimes: list[float] = []
        self.intervals: list[float] = []
        self._last_first: float | None = None

    def seen(self, model: str, now: float) -> None:
        if model in self.first_seen:
            return
        if self._last_first is not None:
            self.intervals = [*self.intervals, now - self._last_first][-KEEP:]
        self._last_first = now
        self.first_seen[model] = now
        while len(self.first_seen) > 4 * KEEP:  # names never retired (another tenant's, a one-off)
            self.first_seen.popitem(last=False)

    def sweep(self, retired: Container[str], now: float) -> None:
        """Note the lifetimes of the versions retired since the last sweep."""
        for model in [m for m in self.first_seen if m in retired]:
            self.lifetimes = [*self.lifetimes, now - self.first_seen.pop(model)][-KEEP:]

    def time_left(self, model: str, now: float) -> float | None:
        """Seconds until an answer for `model` comes too late to be trained, or None while unknown."""
        first = self.first_seen.get(model)
        if first is None or len(self.lifetimes) < 2 or not self.intervals:
            return None
        return first + statistics.median(self.lifetimes) - statistics.median(self.intervals) - now


class Deadlines:
    """One VersionClock per series of versions (`trl-policy-v`, `<tenant>/trl-policy-v`: the name less its trailing
    digits), so that tenants sharing a fleet do not mix their versions' intervals."""

    def __init__(self) -> None:
        self.clocks: dict[str, VersionClock] = {}

    def clock(self, model: str) -> VersionClock:
        series = _TRAILING_DIGITS.sub("", model)
        found = self.clocks.get(series)
        if found is None:
            if len(self.clocks) > 1024:  # bounded: one entry per run's series
                self.clocks.clear()
            found = self.clocks[series] = VersionClock()
        return found

    def seen(self, model: str, now: float) -> None:
        self.clock(model).seen(model, now)

    def sweep(self, retired: Container[str], now: float) -> None:
        for clock in self.clocks.values():
            clock.sweep(retired, now)

    def time_left(self, model: str, now: float) -> float | None:
        return self.clock(model).time_left(model, now)


_TRAILING_DIGITS = re.compile(r"\d+$")


def late_replicas(indices: Iterable[int], replicas, left: float | None, now: float) -> frozenset[int]:
    """Those of `indices` whose replicas would answer after `left` seconds and later than the quickest one by more
    than chance (none when every one would be late, or when `left` is unknown)."""
    indices = list(indices)
    if left is None:
        return frozenset()
    late = set()
    for index in indices:
        pace = replicas[index].pace
        probe = pace.idle and (pace.answered_at is None or now - pace.answered_at > PROBE_AFTER_S)
        if not (probe or pace.latency_s is None or pace.latency_s <= left):
            late.add(index)
    if len(late) == len(indices):
        return frozenset()
    known = [replicas[index].pace.latency_s for index in indices if replicas[index].pace.latency_s is not None]
    near = SLOWER_BY * min(known, default=0.0)  # as quick as the quickest, give or take chance
    return frozenset(index for index in late if replicas[index].pace.latency_s > near)
