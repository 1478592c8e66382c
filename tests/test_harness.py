"""The test harness's own guarantees (issue 42): a child's output is drained as it comes (tests/processes.py Drained),
a port a test binds is held against other sessions (held_ports), every literal wait in a test fits the test's time
limit, and `make test` gives each invocation a folder of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from agrpo.processes.ports import free_ports, reserve_ports
from tests.processes import Drained, held_ports

REPO = Path(__file__).resolve().parent.parent
CHATTY = "import sys\nfor i in range(20000):\n    print('x' * 99); print('y' * 99, file=sys.stderr)\n"


def test_a_child_writing_megabytes_to_both_pipes_ends_and_every_line_is_kept():
    """2 MB on each pipe: with stdout=PIPE read only after `wait()`, the child blocks at 64 KiB and never exits."""
    blocked = subprocess.Popen([sys.executable, "-c", CHATTY], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        blocked.wait(timeout=5)  # the deadlock this helper exists for: a full pipe, nobody reading
        raise AssertionError("a child writing 2 MB into an unread pipe exited: the premise is wrong")
    except subprocess.TimeoutExpired:
        pass
    finally:
        blocked.kill()
        blocked.communicate()
    drained = Drained([sys.executable, "-c", CHATTY])
    out, err = drained.communicate(timeout=120)
    assert drained.returncode == 0
    assert out.splitlines() == ["x" * 99] * 20000 and err.splitlines() == ["y" * 99] * 20000


def test_output_so_far_is_readable_while_the_child_runs():
    drained = Drained([sys.executable, "-u", "-c", "print('ready'); import time; time.sleep(60)"])
    try:
        for _ in range(1200):  # a bound on a wait that must end, not a timing assertion
            if drained.output()[0]:
                break
            time.sleep(0.05)
        assert drained.output() == ("ready\n", "")
    finally:
        drained.kill()
        drained.communicate(timeout=30)


def test_a_held_port_is_skipped_by_every_other_search_until_released():
    """What another test session (a second `make test`) sees while a test holds a port: not free, not reservable."""
    with held_ports(1, 21300) as (port,):
        child = "from agrpo.processes.ports import free_ports, reserve_ports; import sys; p = int(sys.argv[1]); "
        child += "print(free_ports(1, p)[0], reserve_ports(1, p).ports[0])"
        other = subprocess.run([sys.executable, "-c", child, str(port)], capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr[-2000:]
        assert port not in map(int, other.stdout.split())  # another process skips it
    assert free_ports(1, port)[0] == port  # released: free again
    reserve_ports(1, port).release()


def default_limit() -> float:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]


def number(node: ast.AST, constants: dict[str, float]) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return constants.get(node.id) if isinstance(node, ast.Name) else None


def timeout_mark(decorators: list[ast.expr], constants: dict[str, float]) -> float | None:
    """N of a `pytest.mark.timeout(N)` among `decorators` (or a pytestmark list's items)."""
    for node in decorators:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "timeout":
            return number(node.args[0], constants) if node.args else None
    return None


def literal_waits(path: Path) -> list[tuple[str, int, float, float]]:
    """(function, line, wait, limit) of every `timeout=`/`timeout_s=` number passed in `path`, with the time limit of
    the test it is in (a helper's: the module's)."""
    tree = ast.parse(path.read_text())
    constants, module_limit = {}, default_limit()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = number(node.value, constants)
            if value is not None:
                constants[node.targets[0].id] = value
            elif node.targets[0].id == "pytestmark":
                items = node.value.elts if isinstance(node.value, ast.List) else [node.value]
                module_limit = timeout_mark(items, constants) or module_limit
    found = []
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        limit = timeout_mark(function.decorator_list, constants) or module_limit
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            for keyword in call.keywords:
                wait = number(keyword.value, constants) if keyword.arg in ("timeout", "timeout_s") else None
                if wait is not None:
                    found.append((function.name, call.lineno, wait, limit))
    return found


def test_every_literal_wait_in_a_test_is_shorter_than_the_tests_time_limit():
    """A wait as long as the limit never fails with its own message (the child's output, what it waited for):
    pytest-timeout ends the test first, with a stack. tests/launchers/test_accelerate_run.py waited 1800 s under 900."""
    over = [
        f"{path.relative_to(REPO)}:{line} {function}: waits {wait:.0f} s under a {limit:.0f} s limit"
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        for function, line, wait, limit in literal_waits(path)
        if wait >= limit
    ]
    assert not over, "bound these waits below the test's limit (pytest.mark.timeout):\n" + "\n".join(over)


def test_make_test_gives_each_invocation_a_folder_of_its_own():
    """Two `make test` on one machine used to share /tmp/agrpo-tests-<uid>, which each rm -rf'd at its start."""
    dry = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert ".ci/test-lanes.sh" in dry.stdout and "rm -rf" not in dry.stdout
    lanes = (REPO / ".ci" / "test-lanes.sh").read_text()
    assert 'base=$(mktemp -d "${TMPDIR:-/tmp}/agrpo-tests-XXXXXX")' in lanes
    assert lanes.count("--basetemp=") == 2 and all(f'--basetemp="$base/{lane}"' in lanes for lane in ("vllm", "rest"))
