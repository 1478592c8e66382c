"""The policy's signals from the trainer's step lines and vLLM's /metrics (pure), and the files both sides share."""

from __future__ import annotations

import json

import pytest

from agrpo.fleet import files
from agrpo.fleet.signals import BUDGET_LOOKBACK, busy_share, replica_load, window_signals

STEPS = [
    {"perf/step_s": 2.0, "perf/rollout_wait_s": 1.0, "sample/dropped_stale_total": 0, "batch/samples_per_step": 16},
    {"perf/step_s": 2.0, "perf/rollout_wait_s": 0.5, "sample/dropped_stale_total": 4, "batch/samples_per_step": 16},
    {"perf/step_s": 1.0, "perf/rollout_wait_s": 0.0, "rollout/inflight_target": 12},
]


def test_window_signals():
    s = window_signals(STEPS, now=5.0, replicas=2, inflight_ceiling=32, busy=0.5)
    assert s.steps == 3
    assert s.steps_per_s == pytest.approx(3 / 5)
    assert s.wait_share == pytest.approx(1.5 / 5)
    assert s.stale_share == pytest.approx(4 / 36)
    assert (s.inflight_target, s.inflight_ceiling, s.busy_share, s.replicas) == (12, 32, 0.5, 2)


def test_a_budget_that_stopped_rising_is_told_from_one_that_grows():
    def entries(targets):
        return [{"perf/step_s": 1.0, "perf/rollout_wait_s": 0.9, "rollout/inflight_target": t} for t in targets]

    held = window_signals(entries([16, 24, 22] + [22] * (BUDGET_LOOKBACK + 1)), now=1.0, replicas=1)
    assert held.inflight_target == 22 and held.inflight_rising is False
    grew = window_signals(entries([16] * BUDGET_LOOKBACK + [20, 24]), now=1.0, replicas=1)
    assert grew.inflight_rising is True
    young = window_signals(entries([16] * BUDGET_LOOKBACK), now=1.0, replicas=1)
    assert young.inflight_rising is True  # too few steps to tell: the budget still gets its chance
    assert (held.inflight_cut, grew.inflight_cut, young.inflight_cut) == (False, False, False)  # 24 -> 22 is long past
    cut = window_signals(entries([32] * 8 + [25, 25, 21, 21, 19, 20]), now=1.0, replicas=1)
    assert (cut.inflight_cut, cut.inflight_rising) == (True, False)
    climbing = window_signals(entries([16] * 3 + [24, 22] + [23] * 10), now=1.0, replicas=1)
    assert (climbing.inflight_cut, climbing.inflight_rising) == (True, True)


def test_empty_window_knows_nothing():
    s = window_signals([], now=0.0, replicas=1, inflight_ceiling=32)
    assert (s.steps, s.steps_per_s, s.wait_share, s.stale_share, s.inflight_ceiling) == (0, None, None, None, None)


METRICS = """# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""


def test_replica_load_and_busy_share():
    assert replica_load(METRICS) == (3.0, 5.0, 0.25)
    idle = replica_load("vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.9\n")
    assert idle == (0.0, 0.0, 0.9)  # the older KV-cache name
    assert busy_share([(0.0, 1.0, 0.1), (2.0, 4.0, 0.1), (0.0, 1.0, 0.8), None]) == pytest.approx(2 / 3)
    assert busy_share([None]) is None


def test_step_lines_are_read_once_and_a_partial_line_waits(tmp_path):
    reader = files.StepReader(tmp_path)
    assert reader.read() == []
    files.append_step(tmp_path, {"step": 1})
    with files.steps_path(tmp_path).open("a") as out:
        out.write('{"step": 2')
    assert reader.read() == [{"step": 1}]
    with files.steps_path(tmp_path).open("a") as out:
        out.write("}\n")
    assert reader.read() == [{"step": 2}]
    assert reader.read() == []


def test_fleet_figures_from_the_state_file(tmp_path):
    assert files.fleet_figures(tmp_path) == {}
    files.write_state(tmp_path, {"replicas": 2, "replica_seconds": 12.5})
    assert files.fleet_figures(tmp_path) == {"fleet/replicas": 2.0, "fleet/replica_seconds": 12.5}
    assert json.loads(files.state_path(tmp_path).read_text())["replicas"] == 2
