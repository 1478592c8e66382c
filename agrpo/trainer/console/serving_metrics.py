"""The serving side's figures logged beside TRL's metrics: the proxy's routing and each replica's prefix-cache hits.

Why: routing quality only matters if it shows up in real training, so every logged step carries `proxy/*` (routed,
affinity and cold shares, spills, retries, per-replica load and health, load imbalance) and `serving/*` (the
replicas' prefix-cache hit rate from vLLM's own `/metrics`). Parsing is pure (tested on real payloads); the
collector does the HTTP, with short timeouts, and never fails a training step.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from agrpo.interprocess import PROXY_STATS, answer_record

log = logging.getLogger(__name__)

_PROM_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def prometheus_totals(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of every series of each metric in `names` (labels ignored) in Prometheus text format."""
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        match = _PROM_LINE.match(line)
        if match and match.group("name") in totals:
            try:
                value = float(match.group("value"))
            except ValueError:
                continue
            if math.isfinite(value):  # NaN or Inf from a replica is no count
                totals[match.group("name")] += value
    return totals


PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def prefix_cache(text: str) -> tuple[float, float]:
    """(hits, queries) in tokens from one vLLM replica's `/metrics`."""
    totals = prometheus_totals(text, (PREFIX_HITS, PREFIX_QUERIES))
    return totals[PREFIX_HITS], totals[PREFIX_QUERIES]


def proxy_figures(stats: dict[str, Any]) -> dict[str, float]:
    """Flat, cumulative figures from the proxy's `/proxy/stats` answer (typed: agrpo.interprocess.PROXY_STATS),
    named for TensorBoard."""
    routed = stats.get("routed", 0) or 0
    replicas = stats.get("replicas", [])
    figures: dict[str, float] = {
        "proxy/routed": routed,
        "proxy/affinity_share": stats.get("affinity", 0) / routed if routed else 0.0,
        "proxy/cold_share": stats.get("unmatched", 0) / routed if routed else 0.0,
        "proxy/spilled": stats.get("spilled", 0),
        "proxy/retried": stats.get("retried", 0),
        "proxy/failed": stats.get("failed", 0),
        "proxy/healthy_replicas": sum(1 for r in replicas if r.get("healthy")),
    }
    for position, replica in enumerate(replicas):
        index = replica.get("index", position)
        figures[f"proxy/replica{index}/routed"] = replica.get("routed", 0)
        figures[f"proxy/replica{index}/healthy"] = 1.0 if replica.get("healthy") else 0.0
        figures[f"proxy/replica{index}/hung"] = 1.0 if replica.get("hung") else 0.0  # not answering
    loads = [replica.get("routed", 0) for replica in replicas]
    if loads and sum(loads):
        figures["proxy/load_imbalance"] = max(loads) / (sum(loads) / len(loads))
    return figures


def hit_rate_figures(per_replica: list[tuple[float, float] | None]) -> dict[str, float]:
    """`serving/prefix_cache_hit_rate` over every replica that answered, and one per replica."""
    figures: dict[str, float] = {}
    hits = queries = 0.0
    for index, sample in enumerate(per_replica):
        if sample is None:
            continue
        hits, queries = hits + sample[0], queries + sample[1]
        if sample[1]:
            figures[f"serving/replica{index}/prefix_cache_hit_rate"] = sample[0] / sample[1]
    if queries:
        figures["serving/prefix_cache_hit_rate"] = hits / queries
    return figures


def summary_line(figures: dict[str, float]) -> str:
    """One line for the end of a run."""
    parts = []
    if "proxy/routed" in figures:
        healthy = int(figures.get("proxy/healthy_replicas", 0))
        total = sum(1 for key in figures if key.endswith("/healthy") and key.startswith("proxy/replica"))
        parts.append(
            f"proxy routed {int(figures['proxy/routed'])} requests (affinity "
            f"{figures['proxy/affinity_share']:.1%}, cold {figures['proxy/cold_share']:.1%}, spilled "
            f"{int(figures['proxy/spilled'])}, retried {int(figures['proxy/retried'])}), replicas healthy "
            f"{healthy}/{total}"
        )
        if "proxy/load_imbalance" in figures:
            parts.append(f"load imbalance {figures['proxy/load_imbalance']:.2f}")
    if "serving/prefix_cache_hit_rate" in figures:
        parts.append(f"prefix-cache hit rate {figures['serving/prefix_cache_hit_rate']:.1%}")
    return "; ".join(parts)


def _get(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the run's own servers
        return response.read()


QUIET_AFTER_FAILURE_S = 30.0  # a replica whose /metrics did not answer is not asked again for this long


class ServingCollector:
    """Reads the proxy's stats (when the trainer talks to a proxy) and every replica's prefix-cache counters.

    It runs on the trainer's thread at every log, so it never waits on a replica that cannot answer: one the proxy
    marked unhealthy is not asked, and one whose `/metrics` failed (a hung replica times out before the proxy marks
    it) is not asked again for `QUIET_AFTER_FAILURE_S`. A hung replica costs one `timeout_s`, not one per step."""

    def __init__(
        self,
        base_url: str,
        via_proxy: bool,
        timeout_s: float = 2.0,
        get: Callable[[str, float], bytes] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.base_url = base_url.rstrip("/")
        self.via_proxy = via_proxy
        self.timeout_s = timeout_s
        self.get = get or (lambda url, timeout: _get(url, timeout))
        self.clock = clock
        self.last: dict[str, float] = {}
        self._quiet_until: dict[str, float] = {}  # replica URL -> when to ask it again

    def sample(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        replicas = [(self.base_url, True)]  # (url, healthy)
        try:
            if self.via_proxy:
                url = f"{self.base_url}/proxy/stats"
                stats = answer_record(self.get(url, self.timeout_s), PROXY_STATS, url, default=None)
                if stats is not None:  # a bad answer is counted and logged once (agrpo/interprocess.py)
                    figures.update(proxy_figures(stats))
                    replicas = [
                        (r["url"].rstrip("/"), r.get("healthy", True))
                        for r in sorted(stats.get("replicas", []), key=lambda r: r.get("index", 0))
                    ]
        except Exception as error:  # not answering: figures are best effort; training goes on
            log.debug("proxy stats unavailable: %s", error)
        samples: list[tuple[float, float] | None] = []
        for url, healthy in replicas:
            now = self.clock()
            if not healthy or self._quiet_until.get(url, 0.0) > now:
                samples.append(None)
                continue
            try:
                samples.append(prefix_cache(self.get(f"{url}/metrics", self.timeout_s).decode("utf-8", "replace")))
            except Exception as error:  # a replica that is down has no figures this step
                log.debug("metrics of %s unavailable: %s", url, error)
                samples.append(None)
                self._quiet_until[url] = now + QUIET_AFTER_FAILURE_S
        figures.update(hit_rate_figures(samples))
        if figures:
            self.last = figures
        return figures


def log_serving_figures(trainer: Any, collector: ServingCollector) -> None:
    """Add the collector's figures to every training log of an AgrpoAsyncGRPOTrainer (TensorBoard, log_history,
    metrics.json; its `log` leaves TRL's end-of-training summary alone)."""
    trainer.add_log_figures(collector.sample)
