"""CI's vLLM boot budget (docs/ci.md) holds in the docs themselves: every test file that starts vLLM has a row in the
boot table, the table's total is the one the text states, and the counter that fails a session over budget reads it.
The counting itself runs in every session that runs a test marked vllm (tests/conftest.py, tests/boot_counter.py)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.boot_counter import SHARED, documented_boots, over_budget

REPO = Path(__file__).resolve().parents[1]
CI_DOC = REPO / "docs" / "ci.md"


def vllm_test_files() -> set[str]:
    """Test files whose tests are marked vllm (module-wide or one by one)."""
    found = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        if re.search(r"pytest\.mark\.vllm\b", path.read_text()):
            found.add(str(path.relative_to(REPO)))
    return found


def test_every_file_that_starts_vllm_has_a_row_in_the_boot_table():
    documented = documented_boots(CI_DOC)
    missing = vllm_test_files() - set(documented)
    assert not missing, f"add a row to docs/ci.md's boot table for {sorted(missing)}"
    assert SHARED in documented
    stale = set(documented) - vllm_test_files() - {SHARED}
    assert not stale, f"docs/ci.md's boot table names files that start no vLLM: {sorted(stale)}"


def test_the_boot_table_adds_up_to_the_stated_total():
    total = re.search(r"(\d+) vLLM boots per CI run", CI_DOC.read_text())
    assert total, "docs/ci.md states the boots per CI run"
    assert sum(documented_boots(CI_DOC).values()) == int(total[1])


def test_a_file_over_its_documented_boots_or_missing_from_the_table_is_named():
    documented = {"tests/e2e/a.py": 2, SHARED: 1}
    assert over_budget(Counter({"tests/e2e/a.py": 2, SHARED: 1}), documented) == []
    assert over_budget(Counter({"tests/e2e/a.py": 3, "tests/b.py": 1}), documented) == [
        "tests/b.py: 1 vLLM boot(s), docs/ci.md's boot table says 0",
        "tests/e2e/a.py: 3 vLLM boot(s), docs/ci.md's boot table says 2",
    ]


def test_an_engine_core_that_leaves_one_sample_and_returns_is_counted_once(monkeypatch):
    import tests.boot_counter as boot_counter

    monkeypatch.setattr(boot_counter, "engine_cores", lambda: set())
    counter = boot_counter.BootCounter()
    counter.stop()  # its thread ends; the samples below are taken by hand
    samples = iter([{101}, set(), {101, 102}])  # 101 unreadable for one sample, then 102 starts
    monkeypatch.setattr(boot_counter, "engine_cores", lambda: next(samples))
    counter.owner = "tests/x.py"
    for _ in range(3):
        counter.sample()
    assert counter.counted == Counter({"tests/x.py": 2})
