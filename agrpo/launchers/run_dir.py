"""Run dirs that hold nothing: a dry run or a run refused before it started leaves no folder behind.

The run dir's name (`${agrpo_run_suffix:}`: agrpo/paths.py), its checks (agrpo/config/launch_checks.py) and its
record of recipe files (agrpo/config/recipe_files.py) live with the config.
"""

from __future__ import annotations

from pathlib import Path

HYDRA_ONLY = {".hydra"}  # what Hydra writes into every run dir before agrpo runs, besides its job log (*.log)


def holds_nothing(run_dir: Path) -> bool:
    """Whether a run dir holds only what Hydra wrote before agrpo did anything (.hydra/ and its job log)."""
    if not run_dir.is_dir():
        return False
    return all(entry.name in HYDRA_ONLY or (entry.is_file() and entry.suffix == ".log") for entry in run_dir.iterdir())


def discard_if_empty(run_dir: str | Path) -> bool:
    """Remove a run dir that a dry run or a refused run left with nothing in it, so that `ls outputs/NAME/` idioms
    find only runs that ran. Returns whether it was removed."""
    import shutil

    path = Path(run_dir).resolve()
    if not holds_nothing(path) or path in (Path.cwd(), *Path.cwd().parents):
        return False
    shutil.rmtree(path, ignore_errors=True)
    for parent in path.parents:  # outputs/NAME/ and outputs/, when this run was all they held
        if not parent.is_relative_to(Path.cwd()) or parent == Path.cwd():
            break
        try:
            parent.rmdir()
        except OSError:
            break
    return True
