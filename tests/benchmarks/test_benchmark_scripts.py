"""Every script under benchmarks/ that starts no vLLM runs once, with its smallest arguments, as a user runs it, and
prints its table with figures (a script that breaks fails CI instead of going unnoticed). Those that start or use a
vLLM server are in test_benchmark_scripts_vllm.py (the vLLM lane). benchmarks/gpu_check.py runs on the CPU in
tests/test_gpu_check.py (its tiny preset and fp32 arm); the two shell scripts need a GPU machine, so they are
checked here by `bash -n`, their usage and the pipeline check's dry run. Run times: docs/ci.md, "Benchmarks in CI".
No figure is asserted: a benchmark measures, a test only checks that it still does."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.benchmarks.bench_output import REPO, has_number, run_script, table_rows


def test_fleet_simulation_prints_the_three_fleets():
    output = run_script("fleet_simulation.py", "--steps", "40")
    rows = table_rows(output, "| fleet | time (h) |")
    assert [row[0] for row in rows] == ["fixed 1", "fixed 8", "auto 1..8"], rows
    assert all(has_number(row) for row in rows)
    assert re.search(r"auto's fleet \(h: replicas\): 0\.00: 1", output), output


def test_proxy_bench_quick_prints_routing_and_the_proxy_process():
    """--quick: 300 prompts per simulation and short HTTP runs (~17 s) instead of a few minutes; it also runs
    benchmarks/proxy_http.py, its HTTP half."""
    output = run_script("proxy_bench.py", "--quick")
    routing = table_rows(output, "| replicas | in flight | policy |")
    assert {row[2] for row in routing} == {"agrpo", "round-robin", "reference"} and all(map(has_number, routing))
    process = table_rows(output, "| metric | value | target |")
    assert any(row[0].startswith("p50 added latency") and has_number(row) for row in process), process


def test_proxy_bench_compares_two_checkouts():
    """--compare-with, against this same checkout: one round per path."""
    output = run_script("proxy_bench.py", "--quick", "--compare-with", str(REPO), "--rounds", "1")
    rows = table_rows(output, "| path | requests/s |")
    assert [row[0] for row in rows] == ["direct", "this", "other"] and all(map(has_number, rows)), rows
    assert re.search(r"this / other: \d+\.\d+x requests/s", output), output


def test_proxy_slow_body_prints_each_client():
    output = run_script("proxy_slow_body.py", "--seconds", "2")
    for client in ("trainer completion", "trainer adapter load", "no-token completion", "other address"):
        assert re.search(rf"^{client} +\d+/\d+ answered .*latency median \d+\.\d+ s", output, re.M), output
    assert re.search(r"attacking connections: \d+", output), output


def test_the_gpu_shell_scripts_parse_and_say_how_to_use_them():
    """They need a GPU machine (and gpu_check.sh `prepare` the registries): here, their syntax and usage."""
    for script in ("gpu_check.sh", "gpu_pipeline_check.sh"):
        subprocess.run(["bash", "-n", f"benchmarks/{script}"], cwd=REPO, check=True)
    usage = subprocess.run(["bash", "benchmarks/gpu_check.sh"], cwd=REPO, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: bash benchmarks/gpu_check.sh prepare | run" in usage.stderr


def test_the_gpu_pipeline_check_composes_its_run(tmp_path):
    """DRY_RUN=1: the command it would train with is composed, validated and printed as a plan; nothing starts."""
    done = subprocess.run(
        ["bash", "benchmarks/gpu_pipeline_check.sh", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "DRY_RUN": "1",
            "PYTHON": sys.executable,
            "RECIPE": "smoke",
            "MODEL": str(tmp_path / "model"),
            "STEPS": "2",
            "HF_HUB_OFFLINE": "1",
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\[replica\] vllm-0", done.stdout, re.M) and "-m agrpo.trainer" in done.stdout, done.stdout
    assert not (tmp_path / "out" / "gpu_check.json").exists()  # the figures step did not run
