"""An agrpo installed without its source still sends its own code to the trainer Job: the installed files packed
back into a wheel equal the wheel they were installed from, and pip installs the packed one.

Built for real: pip wheel of this checkout, `pip install --no-deps --target` (the venv provides the dependencies),
then the planner and the executor's wheel step run in a child process that sees only the installed copy.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from agrpo.launchers.hf_jobs.package import build_wheel, copy_source, package_root, wheel_filename
from agrpo.launchers.hf_jobs.plan import WheelBuild

CHILD = """
import sys, agrpo
from agrpo.launchers.hf_jobs.planner import local_wheel
from agrpo.launchers.hf_jobs.executor import make_wheel
spec = local_wheel("r1/.agrpo")
print(agrpo.__file__)
print(spec.from_installed, spec.package_root, spec.filename, spec.path_in_bucket)
print(make_wheel(spec, sys.argv[1]))
"""


def pip(*args, cwd):
    subprocess.run(
        [sys.executable, "-m", "pip", *args],
        check=True,
        capture_output=True,
        cwd=cwd,
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def test_an_installed_agrpo_is_packed_back_into_the_wheel_it_came_from(tmp_path):
    root = package_root()
    spec = WheelBuild(str(root), wheel_filename(root), "x", sys.executable)
    built_dir = tmp_path / "built"
    built_dir.mkdir()
    copy_source(spec.package_root, f"{built_dir}/src")
    built = build_wheel(spec.argv(str(built_dir)), spec.filename, str(built_dir))
    site = tmp_path / "site"
    pip("install", "--no-deps", "--target", str(site), str(built), cwd=tmp_path)

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(out)], env=env, cwd=out, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    location, plan_line, packed = done.stdout.splitlines()
    assert location == str(site / "agrpo" / "__init__.py")  # the installed copy, not this checkout
    assert plan_line == f"True {site} {spec.filename} r1/.agrpo/{spec.filename}"
    assert Path(packed) == out / spec.filename

    original, repacked = zipfile.ZipFile(built), zipfile.ZipFile(packed)
    info = next(n for n in original.namelist() if n.endswith(".dist-info/METADATA")).split("/")[0]
    names = set(original.namelist())
    assert set(repacked.namelist()) == names
    for name in names - {f"{info}/RECORD"}:
        assert repacked.read(name) == original.read(name), name
    assert sorted(repacked.read(f"{info}/RECORD").splitlines()) == sorted(original.read(f"{info}/RECORD").splitlines())

    again = tmp_path / "again"
    pip("install", "--no-deps", "--target", str(again), packed, cwd=tmp_path)  # pip checks the RECORD it reads
    assert (again / "agrpo" / "launchers" / "hf_jobs" / "repack.py").read_bytes() == (
        root / "agrpo" / "launchers" / "hf_jobs" / "repack.py"
    ).read_bytes()
