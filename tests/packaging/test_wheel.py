"""agrpo installed from its wheel, run from a directory outside the checkout with the checkout off sys.path.

The wheel is built once per session from the tracked files only (a copy of `git ls-files`, as a fresh clone has),
installed with `pip install --no-deps --target` (the test venv provides the dependencies), and every run asserts
that `agrpo` was imported from that target folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

pytestmark = [
    pytest.mark.packaging,
    pytest.mark.requires(
        None
        if shutil.which("git") is not None and (REPO_ROOT / ".git").exists()
        else "it builds the wheel from `git ls-files` of a checkout: git or the .git folder is missing"
    ),
]


def copy_tracked_files(destination: Path) -> None:
    """The checkout's tracked files (links kept as links), so nothing untracked or stale can reach the wheel."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = REPO_ROOT / name, destination / name
        if not os.path.lexists(source):  # deleted in the work tree, not yet committed
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> Path:
    """Folder holding agrpo installed from a freshly built wheel."""
    root = tmp_path_factory.mktemp("wheel")
    source, wheels, target = root / "src", root / "dist", root / "site"
    copy_tracked_files(source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("agrpo-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True)
    return target


def run_installed(site: Path, cwd: Path, *args: str, module: str = "agrpo") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), HF_HUB_OFFLINE="1", AGRPO_DATA_DIR=str(SHARED_DATA), TMPDIR=str(cwd / "tmp"))
    (cwd / "tmp").mkdir(exist_ok=True)
    code = (
        f"import sys, agrpo; assert agrpo.__file__.startswith({str(site)!r}), agrpo.__file__; "
        f"sys.argv = [{module!r}, *sys.argv[1:]]; import runpy; runpy.run_module({module!r}, run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_wheel_holds_the_config_tree_and_the_license(installed_wheel):
    conf = installed_wheel / "agrpo" / "conf"
    assert (conf / "config.yaml").is_file() and not conf.is_symlink()
    assert {"smoke.yaml", "gsm8k.yaml", "smoke.md"} <= {p.name for p in (conf / "recipe").iterdir()}
    (dist_info,) = installed_wheel.glob("agrpo-*.dist-info")
    metadata = (dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata and "Requires-Dist: huggingface_hub" in metadata
    assert (dist_info / "licenses" / "LICENSE").is_file()


def test_gsm8k_dry_run_from_the_wheel(installed_wheel, tmp_path):
    result = run_installed(installed_wheel, tmp_path, "+recipe=gsm8k", "launcher.dry_run=true")
    assert result.returncode == 0, result.stderr
    assert "[replica]" in result.stdout and "[trainer]" in result.stdout
    assert f"run dir {tmp_path / 'outputs' / 'gsm8k'}/" in result.stdout  # under the working directory
    assert not (tmp_path / "outputs").exists()  # and a dry run leaves no run folder behind


def test_cfg_job_resolve_from_the_wheel(installed_wheel, tmp_path):
    result = run_installed(installed_wheel, tmp_path, "+recipe=smoke", "--cfg", "job", "--resolve")
    assert result.returncode == 0, result.stderr
    assert "${" not in result.stdout  # every interpolation resolved
    assert f"output_dir: {tmp_path}/outputs/smoke/" in result.stdout


def test_user_recipe_building_on_a_shipped_one(installed_wheel, tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /recipe/smoke\n\nrun_name: mine\ntrainer:\n  max_steps: 7\n"
    )
    result = run_installed(installed_wheel, tmp_path, "+recipe=./mine.yaml", "--cfg", "job", "--resolve")
    assert result.returncode == 0, result.stderr
    assert "run_name: mine" in result.stdout and "max_steps: 7" in result.stdout
    assert "lowercase_fraction" in result.stdout  # inherited from the smoke recipe
    assert not list((tmp_path / "tmp").iterdir())  # no temp folder left behind


def test_user_recipe_without_the_package_header(installed_wheel, tmp_path):
    (tmp_path / "bare.yml").write_text("defaults:\n  - /recipe/smoke\n\nlora:\n  r: 2\n")
    result = run_installed(installed_wheel, tmp_path, "+recipe=bare.yml", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["lora"]["r"] == 2 and cfg["run_name"] == "smoke"  # at the top level, over the smoke recipe
    assert not list((tmp_path / "tmp").iterdir())


def test_version_is_agrpos(installed_wheel, tmp_path):
    from agrpo import __version__

    result = run_installed(installed_wheel, tmp_path, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"agrpo {__version__}"


@pytest.mark.parametrize("subcommand", ["eval", "jobs"])
def test_subcommand_help_from_the_wheel(installed_wheel, tmp_path, subcommand):
    result = run_installed(installed_wheel, tmp_path, subcommand, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: agrpo {subcommand}")
