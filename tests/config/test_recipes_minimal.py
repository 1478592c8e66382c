"""Each shipped recipe holds only differences: no value equals what the run would get without that line.

The base a recipe is compared with is the config composed from its own defaults list (group choices such as
`override /model: tiny`, or the recipe it builds on) without its values. The defaults list itself is not checked:
naming the groups pins what the recipe is even if the primary config's defaults change.
"""

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.paths import RECIPES_DIR

RECIPES = sorted(p.stem for p in Path(RECIPES_DIR).glob("*.yaml"))


def base_overrides(defaults: list) -> list[str]:
    """The recipe's defaults list as command-line overrides (what the recipe's values are laid on)."""
    overrides = []
    for entry in defaults:
        if isinstance(entry, str) and entry.startswith("/recipe/"):
            overrides.append(f"+recipe={entry.removeprefix('/recipe/')}")
        elif isinstance(entry, dict):
            ((key, value),) = entry.items()
            group = key.removeprefix("override ").strip().lstrip("/")
            if not group.startswith("hydra"):
                overrides.append(f"{group}={value}")
    return overrides


def leaves(node, prefix=""):
    """(dotted key, value) for every value a recipe sets; lists count as one value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def repeated_values(recipe_text: str) -> list[str]:
    """`key: value` for each value of the recipe that equals what its base already has."""
    body = yaml.safe_load(recipe_text)
    base = compose_run_config(base_overrides(body.pop("defaults", [])), output_dir="/tmp/agrpo-minimal")
    body.pop("hydra", None)  # sweeper settings: no schema default to compare with
    inherited = OmegaConf.to_container(base, resolve=False)
    repeated = []
    for key, value in leaves(body):
        node = inherited
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:  # a new key (e.g. under trainer.extra): not inherited
                node = KeyError
                break
            node = node[part]
        if node is not KeyError and node == value:
            repeated.append(f"{key}: {value!r}")
    return repeated


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_repeats_no_inherited_value(recipe):
    repeated = repeated_values((Path(RECIPES_DIR) / f"{recipe}.yaml").read_text())
    assert not repeated, f"recipes/{recipe}.yaml repeats inherited values (delete these lines): {repeated}"


def test_the_check_catches_a_repeated_value():
    text = "defaults:\n  - override /model: tiny\nlora:\n  r: 8\n  alpha: 32\ntrainer:\n  max_steps: 100\n"
    assert repeated_values(text) == ["lora.r: 8", "trainer.max_steps: 100"]
    assert repeated_values("defaults:\n  - /recipe/smoke\ntrainer:\n  max_steps: 60\n") == ["trainer.max_steps: 60"]
