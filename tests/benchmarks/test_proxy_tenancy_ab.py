"""benchmarks/proxy_bench.py --tenancy-ab (benchmarks/proxy_tenancy_ab.py) runs as a user runs it and prints the
tenancy off/on table with figures: both proxies start, the tenant registers and every request it sends with its token
is answered 200 (the script asserts it). No figure is asserted: a benchmark measures, a test only checks that it
still does."""

from __future__ import annotations

from tests.benchmarks.bench_output import has_number, run_script, table_rows


def test_tenancy_ab_prints_off_on_and_the_ratio():
    output = run_script("proxy_bench.py", "--tenancy-ab", "--quick")
    rows = table_rows(output, "| proxy | requests/s | requests per CPU-second |")
    assert [row[0] for row in rows] == ["tenancy off", "tenancy on", "on / off"], rows
    assert all(map(has_number, rows)), rows
