"""benchmarks/shared_fleet_kill.py's pure parts (`benchmarks/shared_fleet.py --mode kill`): steps/s from real-format
steps.jsonl lines within a time window, and the table. Its runs boot vLLM: run by hand under the vLLM lock."""

from __future__ import annotations

import importlib.util
import json

from tests.benchmarks.bench_output import REPO

spec = importlib.util.spec_from_file_location("shared_fleet_kill", REPO / "benchmarks" / "shared_fleet_kill.py")
kill = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kill)


def line(step: int, t: float) -> str:  # as agrpo's trainer writes fleet/steps.jsonl
    return json.dumps({"t": t, "step": step, "perf/step_s": 0.5, "perf/rollout_wait_s": 0.1})


def test_rates_skip_the_first_steps_and_count_only_the_window():
    text = "\n".join(
        [line(s, 100.0 + s) for s in range(1, 11)] + [line(s, 110.0 + 2 * (s - 10)) for s in range(11, 21)]
    )
    entries = kill.steps_of(text + "\n[1]\nnot json\n" + json.dumps({"t": "x", "step": 3}))
    assert len(entries) == 20  # the bad lines skipped
    assert kill.rate(entries, t_to=110.0) == 1.0  # steps 5..10, one a second
    assert kill.rate(entries, t_from=112.0) == 0.5  # steps 11..20, one every 2 s
    assert kill.rate(entries, t_from=200.0) is None and kill.rate([]) is None


def test_the_table_gives_b_after_the_kill_over_b_alone():
    rows = [{"alone_before": 2.0, "with_a": 1.1, "after_kill": 1.9, "alone_after": 1.8}]
    assert kill.table(rows)[2] == "| 1 | 2.00 | 1.10 | 1.90 | 1.80 | 1.00x |"
    assert kill.table([{**rows[0], "after_kill": None}])[2].endswith("| - | 1.80 | - |")
