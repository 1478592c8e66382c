"""The run summary's per-replica costs (issue 47): pace, share of requests, share of the stale ones."""

import pytest

from agrpo.trainer.console.final_metrics import final_metrics, replica_costs


def test_each_replica_shows_its_pace_and_shares_from_the_latest_proxy_figures():
    history = [
        {"reward": 0.1, "perf/step_s": 0.4, "proxy/replica0/routed": 10, "proxy/replica1/routed": 10},
        {
            "reward": 0.9,
            "perf/step_s": 0.4,
            "proxy/replica0/routed": 160,
            "proxy/replica0/pace": 420.0,
            "proxy/replica0/stale": 1,
            "proxy/replica1/routed": 40,
            "proxy/replica1/pace": 95.5,
            "proxy/replica1/stale": 3,
            "proxy/replica1/healthy": 1.0,
        },
        {"train_runtime": 30.0},
    ]
    costs = final_metrics(history)["replicas"]
    assert costs == {
        "replica0": {"pace_work_per_s": 420.0, "routed_share": 0.8, "stale_share": 0.25},
        "replica1": {"pace_work_per_s": 95.5, "routed_share": 0.2, "stale_share": 0.75},
    }


def test_without_pace_or_stale_figures_the_shares_say_unknown_and_one_replica_runs_show_nothing():
    costs = replica_costs([{"proxy/replica0/routed": 3, "proxy/replica10/routed": 1}])
    assert list(costs) == ["replica0", "replica10"]  # in index order, not text order
    assert costs["replica0"] == {"pace_work_per_s": None, "routed_share": pytest.approx(0.75), "stale_share": None}
    assert "replicas" not in final_metrics([{"reward": 0.5, "perf/step_s": 1.0}])
