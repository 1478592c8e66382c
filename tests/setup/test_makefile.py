"""The Makefile's set-up paths, run by make itself (`make -n` prints what a target would run; the refusals run for
real, stopping at their first line): the CPU and GPU set-ups each have their own stamp, `make test/demo/lint` use
the one .venv holds, and neither installs over the other."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_STACK = ('"torch==2.13.0"', '".[cpu,test]"')  # the CPU set-up's install line

pytestmark = pytest.mark.requires(None if shutil.which("make") else "needs make")  # fail saying so, never skip


@pytest.fixture()
def checkout(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "constraints", tmp_path / "constraints")
    (tmp_path / ".venv").mkdir()
    return tmp_path


def make(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    """`make` as a person runs it in `checkout`: not as a sub-make of `make test` (whose flags and variable overrides
    would carry over), and with VENV pinned to the checkout's own .venv, so nothing outside it can be touched."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    command = ["make", "VENV=.venv", "GPU_VERSIONS_VENV=.venv-gpu-versions", "PY=false", *args]
    return subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=60, env=env)


def stamp(checkout: Path, name: str, fresh: bool = True) -> None:
    """A set-up's stamp, newer than pyproject.toml (fresh) or older (pyproject changed since)."""
    now = time.time()
    for path in [checkout / "pyproject.toml", *(checkout / "constraints").iterdir()]:
        os.utime(path, (now - 3600, now - 3600))
    path = checkout / ".venv" / name
    path.touch()
    when = now if fresh else now - 7200
    os.utime(path, (when, when))


@pytest.mark.parametrize("target", ["test", "demo", "lint", "test-fast"])
def test_a_fresh_checkout_builds_the_cpu_set_up_first(checkout, target):
    dry = make(checkout, "-n", target)
    assert dry.returncode == 0, dry.stderr
    assert all(part in dry.stdout for part in CPU_STACK), dry.stdout
    assert "touch .venv/.agrpo-installed\n" in dry.stdout


@pytest.mark.parametrize("target", ["test", "demo", "lint", "test-fast"])
def test_after_setup_gpu_the_targets_use_it_and_never_install_the_cpu_stack(checkout, target):
    stamp(checkout, ".agrpo-installed-gpu")
    dry = make(checkout, "-n", target)
    assert dry.returncode == 0, dry.stderr
    assert "pip install" not in dry.stdout, dry.stdout  # up to date: straight to the command
    assert ".venv/bin/" in dry.stdout


def test_a_changed_pyproject_refreshes_the_gpu_set_up_not_the_cpu_one(checkout):
    stamp(checkout, ".agrpo-installed-gpu", fresh=False)
    dry = make(checkout, "-n", "test")
    assert '-e ".[gpu,test]"' in dry.stdout and "touch .venv/.agrpo-installed-gpu" in dry.stdout
    assert not any(part in dry.stdout for part in CPU_STACK), dry.stdout


def test_setting_up_one_stack_over_the_other_is_refused_before_installing_anything(checkout):
    stamp(checkout, ".agrpo-installed-gpu")
    refused = make(checkout, "setup")
    assert refused.returncode != 0 and "holds the GPU set-up" in refused.stdout + refused.stderr
    (checkout / ".venv" / ".agrpo-installed-gpu").unlink()
    stamp(checkout, ".agrpo-installed")
    refused = make(checkout, "setup-gpu")
    assert refused.returncode != 0 and "holds the CPU set-up" in refused.stdout + refused.stderr
    assert sorted(p.name for p in (checkout / ".venv").iterdir()) == [".agrpo-installed"]  # nothing installed


def test_the_gpu_versions_environment_is_seeded_from_the_cpu_set_up_and_pinned(checkout):
    stamp(checkout, ".agrpo-installed")
    dry = make(checkout, "-n", "test-gpu-versions")
    assert dry.returncode == 0, dry.stderr
    assert "cp -al" in dry.stdout
    assert '-c constraints/gpu-versions.txt -e ".[cpu,test]"' in dry.stdout  # the GPU resolution alone
    assert "minimum-versions" not in dry.stdout
    assert '"transformers[kernels]"' in dry.stdout and "uninstall --quiet -y torchvision" in dry.stdout
    assert '-m "not vllm"' in dry.stdout and "tests/e2e/" in dry.stdout


def test_the_declared_minimums_have_an_environment_of_their_own(checkout):
    stamp(checkout, ".agrpo-installed")
    dry = make(checkout, "-n", "test-minimum-versions")
    assert dry.returncode == 0, dry.stderr
    assert '-c constraints/minimum-versions.txt -e ".[cpu,test]"' in dry.stdout
    assert "AGRPO_PINNED_FILE=constraints/minimum-versions.txt" in dry.stdout and ".venv-minimum-versions" in dry.stdout


def without_py(checkout: Path, path: Path, *args: str) -> subprocess.CompletedProcess:
    """`make` with PY unset and only the interpreters in `path` to choose from."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PY")}
    env["PATH"] = str(path)  # the shell's builtins and /bin/sh need no PATH; make is named by its full path
    command = [shutil.which("make"), "VENV=.venv", *args]
    return subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=60, env=env)


def fake_python(folder: Path, name: str, minor: int) -> None:
    """An interpreter named `name` that answers the Makefile's version question as Python 3.`minor` would."""
    script = folder / name
    script.write_text(f"#!/bin/sh\nexit {0 if minor >= 11 else 1}\n")
    script.chmod(0o755)


def test_without_python3_11_the_makefile_takes_the_first_python_of_3_11_or_newer(checkout, tmp_path):
    (checkout / ".venv").rmdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_python(bin_dir, "python3", 10)  # too old: passed over
    fake_python(bin_dir, "python3.12", 12)
    dry = without_py(checkout, bin_dir, "-n", "setup")
    assert "|| python3.12 -m venv .venv" in dry.stdout, dry.stdout + dry.stderr
    chosen = without_py(checkout, bin_dir, "-n", "setup", "PY=python3.13")  # an explicit PY wins
    assert "|| python3.13 -m venv .venv" in chosen.stdout


def test_gpu_check_is_one_command_whose_dry_run_a_cpu_machine_can_print(checkout):
    stamp(checkout, ".agrpo-installed-gpu")
    dry = make(checkout, "-n", "gpu-check", "GPU_CHECK_ARGS=--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert ".venv/bin/python benchmarks/gpu_first_hour.py --dry-run" in dry.stdout
