"""Make sure the configured model exists before any server starts: build it (tiny/offline recipes) or check it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.utils import get_method

from agrpo.errors import ConfigError


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.path.isabs(name)


def prepare_model(model_cfg: Any) -> str:
    """Build the model with `model.builder` when set (given `model.builder_input` too when agrpo set one: the warm
    start's spec); fail early and clearly when a local path is missing."""
    name = str(model_cfg.name_or_path)
    if model_cfg.builder:
        try:
            builder = get_method(model_cfg.builder)
        except Exception as error:
            raise ConfigError(f"model.builder={model_cfg.builder!r} cannot be imported: {error}") from None
        given = model_cfg.builder_input
        return str(builder(name, given) if given else builder(name))
    if looks_like_path(name) and not (Path(name).expanduser() / "config.json").is_file():
        raise ConfigError(
            f"model.name_or_path={name!r} is not a model folder (no config.json there). Point it at a folder with a "
            "Hugging Face model, or at a Hub id such as Qwen/Qwen2.5-0.5B-Instruct on a machine with network access."
        )
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not looks_like_path(name) and not _in_hub_cache(name):
        raise ConfigError(
            f"model.name_or_path={name!r} is a Hub id, HF_HUB_OFFLINE=1 is set and it is not in the local cache: "
            "download it first or point model.name_or_path at a local folder."
        )
    return name


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # any failure means "not cached"
        return False
