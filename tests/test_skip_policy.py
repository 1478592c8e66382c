"""The skip policy (tests/skip_policy.py, tests/allowed_skips.toml): a session in which a test skips that the
allow-list does not name, or outside its listed condition, exits non-zero with one line per such skip. The hook is
run for real, in a pytest session of its own over a tiny test folder; the real allow-list is checked against the
suite's skip marks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.skip_policy import ALLOW_LIST, CONDITIONS, Entry, Skip, judge, load_entries, pinned_hub_version

REPO = Path(__file__).resolve().parent.parent

CONFTEST = """
from pathlib import Path
from tests.skip_policy import SkipPolicy

def pytest_configure(config):
    conditions = {"always": lambda: True, "never": lambda: False}
    config.pluginmanager.register(SkipPolicy(Path(__file__).parent / "allowed.toml", conditions), "skip-policy")
"""
TESTS = """
import pytest

def test_runs():
    assert True

@pytest.mark.skipif(True, reason="listed, its condition holds")
def test_listed():
    pass

@pytest.mark.skipif(True, reason="listed, its condition does not hold")
def test_listed_elsewhere():
    pass

def test_skips_itself():
    pytest.skip("nobody listed me")

@pytest.mark.xfail(reason="known to fail")
def test_expected_to_fail():
    assert False
"""
LISTED = """
[[skip]]
tests = "test_a.py::test_listed"
reason = "r"
when = "always"

[[skip]]
tests = "test_a.py::test_listed_elsewhere"
reason = "r"
when = "never"
"""


def session(folder: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """pytest over `folder` holding `files` (and the conftest registering the policy), as a subprocess."""
    folder.mkdir()
    for name, text in {"conftest.py": CONFTEST, "pytest.ini": "[pytest]\n", **files}.items():
        (folder / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not CI's addopts
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def policy_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if re.match(r"(unlisted|\w+ outside its condition|allowed)", line)]


def test_unlisted_skips_and_skips_outside_their_condition_fail_the_session_one_line_each(tmp_path):
    files = {
        "allowed.toml": LISTED,
        "test_a.py": TESTS,
        "test_b.py": "import pytest\npytest.importorskip('no_such_module_anywhere')\n\ndef test_x():\n    pass\n",
    }
    result = session(tmp_path / "run", files)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 passed, 4 skipped, 1 xfailed" in result.stdout
    assert policy_lines(result.stdout) == [  # in the order they happened: collection first
        "unlisted skip: test_b.py (could not import 'no_such_module_anywhere': No module named "
        "'no_such_module_anywhere'): make it run, or list it with its reason and condition in allowed.toml",
        "skip outside its condition: test_a.py::test_listed_elsewhere (listed, its condition does not hold), but "
        "'never' does not hold here (allowed.toml)",
        "unlisted skip: test_a.py::test_skips_itself (nobody listed me): make it run, or list it with its reason and "
        "condition in allowed.toml",
        "unlisted xfail: test_a.py::test_expected_to_fail (known to fail): make it run, or list it with its reason "
        "and condition in allowed.toml",
    ]


def test_listed_skips_under_their_condition_pass_and_xdist_workers_leave_the_verdict_to_the_controller(tmp_path):
    tests = "import pytest\n\n@pytest.mark.skipif(True, reason='r')\ndef test_listed():\n    pass\n"
    allowed = session(tmp_path / "ok", {"allowed.toml": LISTED, "test_a.py": tests + "\ndef test_runs():\n    pass\n"})
    assert allowed.returncode == 0 and "1 passed, 1 skipped" in allowed.stdout, allowed.stdout[-3000:]
    assert policy_lines(allowed.stdout) == []
    unlisted = tests + "\ndef test_other():\n    pytest.skip('no')\n"
    spread = session(tmp_path / "xdist", {"allowed.toml": LISTED, "test_a.py": unlisted}, "-n", "2")
    assert spread.returncode == 1, spread.stdout[-3000:]
    assert [line.split(" (")[0] for line in policy_lines(spread.stdout)] == ["unlisted skip: test_a.py::test_other"]


def test_a_malformed_entry_or_an_unknown_condition_is_named():
    text = '[[skip]]\ntests = "a.py::t"\nreason = "r"\nwhen = "sometimes"\n\n[[skip]]\ntests = "b.py::t"\n'
    entries, problems = load_entries(text, ["always"])
    assert entries == []
    assert problems == [
        "entry 1 (a.py::t): no condition named 'sometimes' (known: ['always'])",
        "entry 2 lacks reason, when",
    ]


def test_a_prefix_entry_covers_its_module_and_an_exact_one_its_test_only():
    entries = [Entry("tests/x.py::*", "r", "on"), Entry("tests/y.py::test_a[1]", "r", "off")]
    skips = [Skip("tests/x.py::test_b[2]", "why", "skip"), Skip("tests/y.py::test_a[1]", "why", "skip")]
    skips.append(Skip("tests/y.py::test_a[2]", "why", "skip"))
    lines = judge(skips, entries, lambda when: when == "on", "allowed.toml")
    assert [line.split(" (")[0] for line in lines] == [
        "skip outside its condition: tests/y.py::test_a[1]",
        "unlisted skip: tests/y.py::test_a[2]",
    ]


def skip_marked_files() -> set[str]:
    """Test files whose source can skip: a skipif/skip/xfail/importorskip, or a mark that skips (gpu count, hub line)."""
    marks = r"^\s*@?(needs_gpus\(|needs_run_job_attempts\b)"  # as a decorator or in a pytestmark list
    pattern = re.compile(rf"skipif\(|pytest\.skip\(|xfail|importorskip|{marks}", re.M)
    return {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if path.name != "test_skip_policy.py" and pattern.search(path.read_text())
    }


def test_the_allow_list_names_every_file_that_can_skip_and_only_tests_that_exist():
    entries, problems = load_entries(ALLOW_LIST.read_text(), CONDITIONS)
    assert problems == []
    listed_files = {entry.tests.split("::")[0] for entry in entries}
    assert skip_marked_files() <= listed_files, f"list these in {ALLOW_LIST.name}: {skip_marked_files() - listed_files}"
    for entry in entries:
        path, name = entry.tests.split("::")
        assert (REPO / path).is_file(), entry
        assert name == "*" or f"def {name}(" in (REPO / path).read_text(), f"{entry.tests} names no test"


def test_the_gpu_versions_condition_reads_the_pinned_1x_line():
    pin = pinned_hub_version()
    assert pin is not None and pin.startswith("1.")


def test_the_hub_condition_holds_for_the_pinned_1x_version_only(monkeypatch):
    """A 1.x other than the pin (an unpinned GPU set-up) or any 2.x: the run_job(attempts=) skips are not allowed."""
    import huggingface_hub

    from tests.skip_policy import hub_is_the_pinned_1x_line

    verdicts = {}
    for version in (pinned_hub_version(), "1.20.0", "2.4.0", "3.0.0"):
        monkeypatch.setattr(huggingface_hub, "__version__", version)
        verdicts[version] = hub_is_the_pinned_1x_line()
    assert verdicts == {pinned_hub_version(): True, "1.20.0": False, "2.4.0": False, "3.0.0": False}
