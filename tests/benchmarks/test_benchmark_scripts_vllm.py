"""Every script under benchmarks/ that needs a vLLM server runs once, with its smallest arguments, as a user runs it,
and prints its table with figures (test_benchmark_scripts.py holds the others). Where a script can use a running
server (`--url`, or the Hydra overrides `role=trainer inference.urls=[...]` it passes to `python -m agrpo`), it uses the
session's shared replica (tests/conftest.py `vllm_server`) instead of booting one: its figures then say nothing about
speed, only that the script still runs end to end. Those whose subject is a boot start their own: the replica start
and the bucket-sync rehearsal (one replica Job); and the two agent tasks, whose prompts with their tool list do not
fit the shared replica's max_model_len of 256: one boot each. Boots: docs/ci.md's table; run times: its
"Benchmarks in CI". No figure is asserted: a benchmark measures, a test only checks that it still does."""

from __future__ import annotations

import re

import pytest

from agrpo.inference.vllm_server import unload_adapters
from agrpo.rehearsal.runner import namespaces_available
from tests.benchmarks.bench_output import has_number, run_script, table_rows
from tests.processes import held_ports

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture
def shared(vllm_server, tiny_model_dir):
    """Overrides that train against the shared replica; its trl-policy-* adapters unloaded before and after, so each
    run starts at v1 as on a fresh server."""
    unload_adapters(vllm_server.url)
    yield [
        "role=trainer",
        f"inference.urls=[{vllm_server.url}]",
        f"model.name_or_path={tiny_model_dir}",
        "model.builder=null",
    ]
    unload_adapters(vllm_server.url)


def test_pipeline_bench(vllm_server, tiny_model_dir):
    """--url: the shared replica instead of one of its own; 4 steps per mode (3 are warm-up)."""
    unload_adapters(vllm_server.url)
    output = run_script("pipeline_bench.py", "--steps", "4", "--url", vllm_server.url, "--model", str(tiny_model_dir))
    rows = table_rows(output, "| mode | seconds per optimizer step |")
    assert [row[0] for row in rows[:4]] == ["async", "lock-step", "gen-only", "train-only"], rows
    assert all(has_number(row) for row in rows)


def test_throughput_run_and_table(shared, tmp_path):
    out = tmp_path / "bench"
    output = run_script("throughput.py", "run", "--topology", "1", "--modes", "new", "--out", str(out), *shared,
                        "trainer.max_steps=4")  # fmt: skip
    rows = table_rows(output, "| topology | figure |")
    steps = next(row for row in rows if row[1] == "steps/s")
    assert re.fullmatch(r"\d+\.\d+", steps[3]), rows
    again = table_rows(run_script("throughput.py", "table", str(out)), "| topology | figure |")
    assert again == rows


def test_elastic_run_table_and_plot(shared, tmp_path):
    """One mode (fixed-min) on the shared replica; the fleet's own runs are tests/e2e/test_elastic.py's."""
    out = tmp_path / "bench"
    output = run_script("elastic.py", "run", "--modes", "fixed-min", "--out", str(out), *shared, "trainer.max_steps=4")
    rows = table_rows(output, "| figure | fixed-min |")
    assert rows[0][0] == "wall s (n=1)" and has_number(rows[0]), rows
    assert table_rows(run_script("elastic.py", "table", str(out)), "| figure | fixed-min |") == rows
    run_script("elastic.py", "plot", str(out / "elastic-1-fixed-min-history.json"), str(tmp_path / "fleet.png"))
    assert (tmp_path / "fleet.png").stat().st_size > 1000


def test_trainer_start(shared):
    output = run_script("trainer_start.py", "--repeats", "1", "--", *shared, "trainer.max_steps=2")
    rows = table_rows(output, "| trainer starts | first step |")
    assert len(rows) == 2 and all(has_number(row) for row in rows), rows
    assert re.search(r"first step \d+\.\d+x sooner", output), output


def test_agent_routing():
    """One run of its own replica (1 boot; the agent prompts with their tool list exceed the shared replica's
    max_model_len), 2 steps, a 5-step warm start (the recipe's 300 take ~100 s)."""
    output = run_script("agent_routing.py", "--replicas", "1", "trainer.max_steps=2", "agent.warmstart.steps=5")
    rows = table_rows(output, "| replicas | continuations on the prefix's replica |")
    assert [row[0] for row in rows] == ["1"] and all(has_number(row) for row in rows), rows


def test_own_tool_task():
    """Its own replica (1 boot, as agent_routing), 2 steps, a 5-step warm start (its 300 take ~100 s)."""
    output = run_script("own_tool_task/run.py", "--steps", "2", "agent.warmstart.steps=5")
    assert re.search(r"tool calls per episode, first 5 steps -> last 5: \d+\.\d+ -> \d+\.\d+", output), output
    assert re.search(r"reward \(numeric_match\), first 5 steps -> last 5: \d+\.\d+ -> \d+\.\d+", output), output


def test_cpu_replica_start():
    """Its subject is the boot: one start of agrpo's replica here (1 boot), 16 completions timed."""
    with held_ports(1, 18950) as (port,):  # held until the script binds it: no other session races for it
        args = ("--repeats", "1", "--arms", "agrpo", "--requests", "16", "--port", str(port))
        output = run_script("cpu_replica_start.py", *args)
    rows = table_rows(output, "| medians of 1 |")
    assert [row[0] for row in rows] == ["s to /health", "tokens/s, 16 at a time"] and all(map(has_number, rows))


@pytest.mark.requires(namespaces_available())
def test_rehearsal_sync():
    """The ungated half (the e2e rehearsal runs the gated one), one replica Job, one step: 1 boot."""
    args = ("--gates", "off", "--replicas", "1", "--steps", "1", "--negative-cache", "2")
    rows = table_rows(run_script("rehearsal_sync.py", *args), "| visibility gate |")
    assert rows[0][0] == "off" and has_number(rows[0]), rows


def test_shared_fleet():
    """Two points, 6 steps each, once: the sweep on its own fleets (a boot per point) against one shared fleet (one
    boot): 3 boots. The boots are behaviour, not speed: each arm's count is checked."""
    output = run_script("shared_fleet.py", "--repeats", "1", "--steps", "6", "--points", "1,4", timeout=800)
    rows = {row[0]: row for row in table_rows(output, "| figure (median of 1) |")}
    assert has_number(rows["wall time"]) and has_number(rows["replica-seconds"]), rows
    assert rows["vLLM boots"][1:3] == ["2", "1"], rows
    assert {
        "reward rise, lora.r=1 (first 5 -> last 5 steps)",
        "reward rise, lora.r=4 (first 5 -> last 5 steps)",
    } <= set(rows), rows


def test_lora_churn_check_serves_every_request_as_named(vllm_server, tiny_model_dir):
    """The one check here whose figure is asserted, because it is a correctness claim, not a speed: 3 tenants (ranks
    1, 4, 8) churn 6 versions each through the shared replica's 4 LoRA slots and 4-adapter CPU cache while requests
    decode; every sampled token's logprob equals peft's under the named version (the script exits 0), and the
    control against the version before differs, so the comparison can fail (docs/shared_fleet.md)."""
    args = ["--url", vllm_server.url, "--model", str(tiny_model_dir), "--max-rank", "8", "--tenants", "3"]
    try:
        output = run_script("lora_churn_check.py", *args, "--versions", "6")
    finally:
        unload_adapters(vllm_server.url, prefix="t")
    rows = table_rows(output, "| tenant | rank |")
    assert [row[1] for row in rows] == ["1", "4", "8"] and all(row[2] == "24" for row in rows), rows
    assert all(float(row[3].split("/")[1]) <= 1e-3 for row in rows), rows
    assert all(float(row[4]) > 1e-3 for row in rows), rows
