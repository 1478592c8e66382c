"""The replicas behind the proxy: address, health and outstanding work. No I/O here."""

import asyncio
from dataclasses import dataclass, field

import yarl

from agrpo.proxy.pace import Pace, relative_paces


@dataclass(eq=False)
class Replica:
    """One vLLM server. `index` is stable for its lifetime (the X-Agrpo-Replica value)."""

    index: int
    url: str
    healthy: bool = True
    inflight: int = 0
    work: float = 0.0  # outstanding prompt tokens + max_tokens x n of its in-flight requests
    routed: int = 0
    consecutive_errors: int = 0
    last_error: str = ""
    authorization: str | None = field(default=None, repr=False)  # upstream token, if allowed
    admitting: bool = False  # a re-admission (state replay) is under way
    adapters: set[str] = field(default_factory=set)  # adapters it serves, of those loaded through the proxy
    hung: bool = False  # out of rotation because it stopped answering (timeouts), not because it refused
    down_since: float | None = None  # the event loop's clock when it was marked unhealthy
    # set while it is marked unhealthy: a broadcast still waiting for its answer stops waiting (broadcast.py)
    down: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    exchanges: set = field(default_factory=set, repr=False)  # its routed requests in flight (pool.Exchange)
    pace: Pace = field(default_factory=Pace, repr=False)  # work it finishes per busy second (pace.py)
    late: int = 0  # answers that came back after their adapter version was retired: certainly dropped as stale
    aborted_stale: int = 0  # requests aborted in flight when their adapter version was retired
    _urls: dict = field(default_factory=dict, repr=False)

    def mark_down(self, reason: str, hung: bool, now: float) -> bool:
        """Out of rotation until a probe re-admits it; True if it was in rotation until now."""
        was_healthy = self.healthy
        self.healthy = False
        self.last_error = reason
        self.hung = hung if was_healthy else self.hung or hung  # a dropped request failing later is no news
        if was_healthy or self.down_since is None:
            self.down_since = now
        self.down.set()
        return was_healthy

    def mark_up(self) -> None:
        """Back in rotation (after its state was replayed)."""
        self.healthy = True
        self.hung = False
        self.down_since = None
        self.consecutive_errors = 0
        self.last_error = ""
        self.down.clear()

    def target(self, path_qs: str) -> yarl.URL:
        """Upstream URL for a path (cached: building yarl URLs is not free on the hot path)."""
        url = self._urls.get(path_qs)
        if url is None:
            if len(self._urls) > 256:
                self._urls.clear()
            url = self._urls[path_qs] = yarl.URL(self.url + path_qs, encoded=True)
        return url

    def begin(self, work: float, now: float) -> None:
        self.inflight += 1
        self.work += work
        self.routed += 1
        self.pace.begin(now)

    def end(self, work: float, now: float, answered: bool = True, took_s: float | None = None) -> None:
        self.inflight -= 1
        self.work = max(0.0, self.work - work)
        self.pace.end(work, now, answered, took_s)

    @property
    def pace_work_per_s(self) -> float:
        """Its measured pace (0 while unknown), for the Prometheus gauge."""
        return self.pace.rate or 0.0

    def describe(self) -> dict:
        return {
            "index": self.index,
            "url": self.url,
            "healthy": self.healthy,
            "inflight": self.inflight,
            "routed": self.routed,
            "outstanding_work": self.work,
            "pace_work_per_s": self.pace.rate,
            "answer_s": self.pace.latency_s,
            "late": self.late,
            "aborted_stale": self.aborted_stale,
            "last_error": self.last_error,
            "hung": self.hung,
            "adapters": sorted(self.adapters),
        }


class ReplicaSet:
    """Replicas in `--upstream` order; indices of later additions continue the count."""

    def __init__(self, urls: list[str]):
        self._by_index: dict[int, Replica] = {}
        self._next_index = 0
        self.adapters: set[str] = set()  # adapter names loaded through the proxy: routed only to their holders
        for url in urls:
            self.add(url)

    def __iter__(self):
        return iter(list(self._by_index.values()))

    def __len__(self) -> int:
        return len(self._by_index)

    def __getitem__(self, index: int) -> Replica:
        return self._by_index[index]

    def get(self, index: int) -> Replica | None:
        return self._by_index.get(index)

    def find(self, url: str) -> Replica | None:
        url = normalize_url(url)
        for replica in self._by_index.values():
            if replica.url == url:
                return replica
        return None

    def add(self, url: str, healthy: bool = True) -> Replica:
        replica = Replica(index=self._next_index, url=normalize_url(url), healthy=healthy)
        self._by_index[replica.index] = replica
        self._next_index += 1
        return replica

    def remove(self, url: str) -> Replica | None:
        replica = self.find(url)
        if replica is not None:
            del self._by_index[replica.index]
        return replica

    def healthy(self) -> list[Replica]:
        return [r for r in self._by_index.values() if r.healthy]

    def loads(self, exclude: set[int] | frozenset = frozenset(), model: str | None = None) -> dict[int, float]:
        """Outstanding work of the replicas a request may go to (all, if none is healthy). A request naming an adapter
        loaded through the proxy goes only to healthy replicas that hold it, while there is one (availability.py)."""
        candidates = [r for i, r in self._by_index.items() if i not in exclude]
        if model is not None and model in self.adapters:
            holders = [r for r in candidates if model in r.adapters]
            if any(r.healthy for r in holders):
                candidates = holders
        loads = {r.index: r.work for r in candidates if r.healthy}
        if not loads and not any(r.healthy for r in self._by_index.values()):
            # every replica is marked down: the marks may be stale, so try them anyway
            loads = {r.index: r.work for r in candidates}
        return loads

    def paces(self, indices) -> dict[int, float]:
        """The relative pace (fastest measured = 1) of each of these replicas, for the router."""
        return relative_paces({i: self._by_index[i].pace.rate for i in indices if i in self._by_index})


def normalize_url(url: str) -> str:
    return url.strip().rstrip("/")
