"""The wheel of the code that launches a run, so the trainer Job runs exactly that code (not an index's `agrpo`).

`package_root()` finds the source tree of the imported agrpo (a checkout or an unpacked sdist: the folder above the
package holding agrpo's pyproject.toml); `wheel_filename()` names the file `pip wheel` will build from it, so the
plan can name the file the trainer Job installs before it exists; `build_wheel()` builds it (I/O) from a copy of
the tree, because setuptools writes build/ and *.egg-info into the tree it builds and would ship stale modules
left in build/ by an earlier build.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

from agrpo.errors import LaunchError


def package_root() -> Path | None:
    """The folder holding agrpo's pyproject.toml above the imported package, or None (installed without source)."""
    import agrpo

    root = Path(agrpo.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if name == "agrpo" else None


def package_version(root: Path) -> str:
    """The version pip will stamp on the wheel: pyproject's, or agrpo.__version__ when it is dynamic."""
    from packaging.version import Version

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    version = project.get("version")
    if version is None:
        import agrpo

        version = getattr(agrpo, "__version__", None)
    if version is None:
        raise LaunchError(f"cannot tell agrpo's version from {root / 'pyproject.toml'}: set project.version")
    return str(Version(str(version)))


def wheel_filename(root: Path) -> str:
    return f"agrpo-{package_version(root)}-py3-none-any.whl"


# Never copied into the build: outputs, caches, environments and earlier builds.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "outputs",
    "multirun",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "*.pyc",
)


def copy_source(root: str, dest: str) -> None:
    shutil.copytree(root, dest, ignore=NOT_SOURCE, symlinks=True)


def build_wheel(argv: list[str], expected: str, out_dir: str) -> Path:
    """Run `pip wheel` (argv from the plan) into out_dir and return the wheel; it must be the file the plan names."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise LaunchError(
            f"building agrpo's wheel failed (`{' '.join(argv)}`, exit {done.returncode}); no Job was "
            f"created. Its last lines:\n{tail}"
        )
    built = sorted(Path(out_dir).glob("agrpo-*.whl"))
    if [w.name for w in built] != [expected]:
        raise LaunchError(
            f"pip built {[w.name for w in built]} but the plan names {expected}: the version changed "
            "between planning and building; launch again"
        )
    return built[0]


def wheel_build_dir() -> str:
    return tempfile.mkdtemp(prefix="agrpo-wheel-")
