"""`+recipe=` given as a path to the user's own YAML: read, stored in Hydra's ConfigStore, remembered as typed.

Shared by every entrypoint that composes a run config (`python -m agrpo`, `agrpo eval`, serve_replica), so that
each accepts the same overrides; and how a run dir records them as typed (.hydra/recipe_files.yaml), which the
commands printed after a run (trainer console, `agrpo push`) replay.
"""

from __future__ import annotations

import os
from pathlib import Path

from agrpo.errors import ConfigError
from agrpo.paths import RECIPES_DIR


def expand_recipe_paths(argv: list[str]) -> list[str]:
    """Let `+recipe=` take a path to the user's own YAML: it becomes a `recipe` group option held in memory.

    `+recipe=NAME` is a file under agrpo/conf/recipe (recipes/ in the checkout). A path is read and stored in Hydra's
    ConfigStore as `recipe/<stem>` (nothing is written anywhere), in package `_global_` unless its own
    `# @package` header says otherwise: the header is optional. Raises ConfigError when the file is not there.
    """
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in ("+recipe", "recipe") and (value.endswith((".yaml", ".yml")) or os.sep in value):
            arg = f"{key}={store_recipe_file(value)}"
        out.append(arg)
    return out


def store_recipe_file(value: str) -> str:
    """Store the recipe file at `value` as a `recipe` group option and return the option's name."""
    from hydra.core.config_store import ConfigStore
    from hydra.plugins.config_source import ConfigSource
    from omegaconf import OmegaConf

    source = Path(value).expanduser().resolve()
    if not source.is_file():
        raise ConfigError(f"recipe file {value!r} does not exist (+recipe= takes a recipe name or a YAML path)")
    text = source.read_text()
    try:
        package = ConfigSource._get_header_dict(text)["package"] or "_global_"
        node = OmegaConf.create(text)
    except Exception as error:  # a YAML or header syntax error: the message says where
        raise ConfigError(f"recipe file {value!r} cannot be read: {error}") from None
    # A shipped recipe of the same name would shadow the file (it comes first in Hydra's search path).
    name = source.stem if not (RECIPES_DIR / f"{source.stem}.yaml").exists() else f"{source.stem}_file"
    ConfigStore.instance().store(group="recipe", name=name, node=node, package=package, provider=str(source))
    TYPED_RECIPES[name] = value
    return name


TYPED_RECIPES: dict[str, str] = {}  # recipe option name -> the recipe file as typed (recorded in each run dir)


RECIPE_FILES = ".hydra/recipe_files.yaml"  # recipe option name -> the YAML path as typed (+recipe=my_task.yaml)


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
