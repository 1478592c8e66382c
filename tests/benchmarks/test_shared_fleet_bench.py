"""benchmarks/shared_fleet.py's pure parts: boots and replica-seconds read from real-format vLLM log lines, the reward
rise, the table of medians. Its runs boot vLLM (a 4-point sweep twice): run by hand under the vLLM lock."""

from __future__ import annotations

import importlib.util
from datetime import datetime

from tests.benchmarks.bench_output import REPO

spec = importlib.util.spec_from_file_location("shared_fleet_bench", REPO / "benchmarks" / "shared_fleet.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

LOG = """Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=4000) INFO 12-07 04:01:23 [api_utils.py:347]        version 0.32.0
(EngineCore pid=4615) INFO 12-07 04:01:44 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: x
(APIServer pid=4000) INFO 12-07 04:02:10 [loggers.py:1] Engine 000: Avg prompt throughput
"""


def test_boots_count_every_engine_start_and_replica_seconds_run_from_the_first_timestamp_to_the_last_write():
    restarted = LOG + LOG.replace("04:01", "04:05")  # a replica restarted into the same log
    assert bench.boots([LOG, restarted]) == 3
    stop = datetime(2026, 12, 7, 4, 3, 23).timestamp()
    assert bench.replica_seconds([LOG, "no timestamp"], [stop, stop], 2026) == 120.0


def test_the_table_shows_medians_ratios_and_each_points_rise():
    run = {"sequential": {"wall_s": 400.0, "boots": 4, "replica_s": 380.0, "rises": [0.4, 0.5]}}
    results = [
        {
            **run,
            "shared": {"wall_s": 200.0, "boots": 1, "replica_s": 190.0, "fleet_replica_s": 195.0, "rises": [0.3, None]},
        },
        {
            **run,
            "shared": {"wall_s": 240.0, "boots": 1, "replica_s": 230.0, "fleet_replica_s": 235.0, "rises": [0.5, None]},
        },
    ]
    lines = bench.table(results, ["1", "4"])
    assert "| wall time | 400 s | 220 s | 0.55x |" in lines
    assert "| vLLM boots | 4 | 1 | 0.25x |" in lines
    assert "| replica-seconds, the fleet's own count (fleet_summary.json) | - | 215 | - |" in lines
    assert "| reward rise, lora.r=1 (first 5 -> last 5 steps) | +0.400 | +0.400 | - |" in lines
    assert "| reward rise, lora.r=4 (first 5 -> last 5 steps) | +0.500 | - | - |" in lines
    assert bench.rise({"reward_last": 0.7, "reward_first": 0.2}) == 0.7 - 0.2 and bench.rise({}) is None
