"""Run directories on a shared machine: a name no other run can get, and no silent reuse of an earlier run's outputs.

`${agrpo_run_suffix:}` (used by hydra.run.dir in conf/config.yaml) is `<pid>-<4 random hex digits>`, made once per
process: two runs started in the same second differ by pid on one machine, and by the random part across
machines sharing a filesystem. It is made once because Hydra may resolve hydra.run.dir more than once.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agrpo.config.run_dir_checks import PREVIOUS_OUTPUTS, previous_outputs, refuse_mixed_outputs, resumes  # noqa: F401

RESOLVER = "agrpo_run_suffix"
_SUFFIX: list[str] = []


def run_suffix() -> str:
    if not _SUFFIX:
        _SUFFIX.append(f"{os.getpid()}-{secrets.token_hex(2)}")
    return _SUFFIX[0]


def register_run_dir_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, run_suffix)


# ---- what a run dir records beyond Hydra, and run dirs that hold nothing ---------------------------------------

RECIPE_FILES = ".hydra/recipe_files.yaml"  # recipe option name -> the YAML path as typed (+recipe=my_task.yaml)
HYDRA_ONLY = {".hydra"}  # what Hydra writes into every run dir before agrpo runs, besides its job log (*.log)


def record_recipe_files(run_dir: str | Path, files: dict[str, str]) -> None:
    """Keep how recipe files were typed: the CLI hands Hydra a recipe option named after the file's stem, which
    `agrpo eval +recipe=<stem>` could not find."""
    if files:
        import yaml

        path = Path(run_dir) / RECIPE_FILES
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(dict(files)))


def typed_overrides(run_dir: str | Path) -> list[str]:
    """The run's Hydra overrides as the user typed them: a recipe file by its path, not by its stored name."""
    import yaml

    run_dir = Path(run_dir)
    try:
        overrides = [str(o) for o in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []]
    except (OSError, ValueError):
        return []
    try:
        files = yaml.safe_load((run_dir / RECIPE_FILES).read_text()) or {}
    except (OSError, ValueError):
        files = {}
    typed = []
    for override in overrides:
        key, _, value = override.partition("=")
        typed.append(f"{key}={files[value]}" if key.lstrip("+") == "recipe" and value in files else override)
    return typed


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
