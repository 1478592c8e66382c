"""Where the project's config lives, and the OmegaConf resolvers that point at it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"
RECIPES_DIR = REPO_ROOT / "recipes"


def register_resolvers() -> None:
    """`${agrpo_root:}`: the checkout's root, so defaults such as data_dir work from any working directory."""
    if not OmegaConf.has_resolver("agrpo_root"):
        OmegaConf.register_new_resolver("agrpo_root", lambda: str(REPO_ROOT))
