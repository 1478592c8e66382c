"""Counters and latency histograms, rendered as /proxy/stats JSON and Prometheus text."""

from bisect import bisect_left

from agrpo.proxy.routing import AFFINITY, COLD, SPILL

# seconds; fine at the low end, where the proxy's own overhead lives
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


def label(value) -> str:
    """A Prometheus label value, escaped (backslash, quote, newline) so it cannot end the
    label or the line and inject series of its own."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    """A cumulative-bucket histogram (Prometheus semantics)."""

    __slots__ = ("bounds", "counts", "total", "count")

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def prometheus(self, name: str, labels: str) -> list[str]:
        lines = []
        cumulative = 0
        sep = "," if labels else ""
        for bound, count in zip(self.bounds, self.counts):
            cumulative += count
            lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


def replica_shares(described: list[dict]) -> list[dict]:
    """Each replica's share of the routed requests and of the stale ones (answered after their version was retired,
    or aborted when it was: certainly dropped as stale), beside its pace: what a slow replica costs (issue 47)."""
    routed = sum(r["routed"] for r in described)
    stale = sum(r["late"] + r["aborted_stale"] for r in described)
    for r in described:
        r["routed_share"] = r["routed"] / routed if routed else None
        r["stale_share"] = (r["late"] + r["aborted_stale"]) / stale if stale else None
    return described


class Metrics:
    """Everything the proxy counts. Mutated only from the event loop thread."""

    def __init__(self, budget=None):
        self.budget = budget  # trust.BodyBudget: request bytes held now / at most
        self.stream_cuts = 0  # streams a replica cut short (the client got an error event)
        self.routed = 0
        self.by_kind = {AFFINITY: 0, SPILL: 0, COLD: 0}
        self.retried = 0
        self.failed = 0  # routed requests answered with a proxy-made error
        self.rejected = 0  # malformed or oversized bodies
        self.retired = 0  # routed requests naming a retired adapter (answered 410)
        self.late = 0  # answers that came back after their adapter version was retired (certainly dropped as stale)
        self.broadcasts: dict[str, int] = {}
        self.broadcast_failures: dict[str, int] = {}
        self.routed_seconds = {kind: Histogram() for kind in self.by_kind}
        self.broadcast_seconds: dict[str, Histogram] = {}

    def count_route(self, kind: str) -> None:
        self.routed += 1
        self.by_kind[kind] += 1

    def observe_routed(self, kind: str, seconds: float) -> None:
        self.routed_seconds[kind].observe(seconds)

    def observe_broadcast(self, op: str, ok: bool, seconds: float) -> None:
        self.broadcasts[op] = self.broadcasts.get(op, 0) + 1
        if not ok:
            self.broadcast_failures[op] = self.broadcast_failures.get(op, 0) + 1
        self.broadcast_seconds.setdefault(op, Histogram()).observe(seconds)

    def stats(self, replicas, tracked: int) -> dict:
        return {
            "routed": self.routed,
            "affinity": self.by_kind[AFFINITY],
            "spilled": self.by_kind[SPILL],
            "unmatched": self.by_kind[COLD],
            "retried": self.retried,
            "failed": self.failed,
            "rejected": self.rejected,
            "retired": self.retired,
            "tracked_routing_entries": tracked,
            "broadcasts": dict(self.broadcasts),
            "broadcast_failures": dict(self.broadcast_failures),
            "stream_cuts": self.stream_cuts,
            "body_bytes_held": self.budget.held if self.budget else 0,
            "body_bytes_peak": self.budget.peak if self.budget else 0,
            "body_budget_refused": self.budget.refused if self.budget else 0,
            "late": self.late,
            "aborted_stale": sum(r.aborted_stale for r in replicas),
            "replicas": replica_shares([r.describe() for r in replicas]),
        }

    def prometheus(self, replicas, tracked: int) -> str:
        """The Prometheus text exposition: the proxy's counters, then its gauges (replicas), then its histograms."""
        lines = self._counter_lines() + self._gauge_lines(replicas, tracked) + self._histogram_lines()
        return "\n".join(lines) + "\n"

    def _counter_lines(self) -> list[str]:
        lines = [
            "# HELP agrpo_proxy_routed_total Routed completion requests by routing outcome.",
            "# TYPE agrpo_proxy_routed_total counter",
        ]
        for kind, count in self.by_kind.items():
            lines.append(f'agrpo_proxy_routed_total{{kind="{label(kind)}"}} {count}')
        for name, value, doc in (
            ("retried", self.retried, "Routed requests retried on another replica."),
            ("failed", self.failed, "Routed requests answered with a proxy-made error."),
            ("rejected", self.rejected, "Malformed or oversized request bodies."),
            ("retired", self.retired, "Routed requests naming an adapter the trainer had unloaded (410)."),
            ("stream_cuts", self.stream_cuts, "Streams a replica cut short (client got an error)."),
            (
                "body_budget_refused",
                self.budget.refused if self.budget else 0,
                "Requests refused (503) while --max-inflight-body-bytes were held.",
            ),
        ):
            lines += [
                f"# HELP agrpo_proxy_{name}_total {doc}",
                f"# TYPE agrpo_proxy_{name}_total counter",
                f"agrpo_proxy_{name}_total {value}",
            ]
        lines += [
            "# HELP agrpo_proxy_broadcasts_total Broadcast operations by outcome.",
            "# TYPE agrpo_proxy_broadcasts_total counter",
        ]
        for op, count in self.broadcasts.items():
            failed = self.broadcast_failures.get(op, 0)
            op = label(op)
            lines.append(f'agrpo_proxy_broadcasts_total{{op="{op}",ok="true"}} {count - failed}')
            lines.append(f'agrpo_proxy_broadcasts_total{{op="{op}",ok="false"}} {failed}')
        return lines

    def _gauge_lines(self, replicas, tracked: int) -> list[str]:
        lines = [
            "# HELP agrpo_proxy_tracked_routing_entries Routing entries held in the LRU.",
            "# TYPE agrpo_proxy_tracked_routing_entries gauge",
            f"agrpo_proxy_tracked_routing_entries {tracked}",
        ]
        for name, attr, doc in (
            ("replica_healthy", "healthy", "1 when the replica takes traffic."),
            ("replica_inflight", "inflight", "Requests in flight on the replica."),
            ("replica_outstanding_work", "work", "Prompt tokens + max_tokens x n in flight."),
            ("replica_routed_total", "routed", "Requests sent to the replica."),
            ("replica_pace_work_per_s", "pace_work_per_s", "Work it finished per busy second (0: not measured)."),
            ("replica_late_total", "late", "Answers that came back after their adapter version was retired."),
            (
                "replica_aborted_stale_total",
                "aborted_stale",
                "Requests aborted when their adapter version was retired.",
            ),
        ):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP agrpo_proxy_{name} {doc}", f"# TYPE agrpo_proxy_{name} {kind}"]
            for r in replicas:
                lines.append(
                    f'agrpo_proxy_{name}{{replica="{r.index}",url="{label(r.url)}"}} {float(getattr(r, attr))}'
                )
        return lines

    def _histogram_lines(self) -> list[str]:
        lines = [
            "# HELP agrpo_proxy_routed_seconds Client-visible latency of routed requests.",
            "# TYPE agrpo_proxy_routed_seconds histogram",
        ]
        for kind, hist in self.routed_seconds.items():
            lines += hist.prometheus("agrpo_proxy_routed_seconds", f'kind="{label(kind)}"')
        lines += [
            "# HELP agrpo_proxy_broadcast_seconds Latency of broadcast operations.",
            "# TYPE agrpo_proxy_broadcast_seconds histogram",
        ]
        for op, hist in self.broadcast_seconds.items():
            lines += hist.prometheus("agrpo_proxy_broadcast_seconds", f'op="{label(op)}"')
        return lines
