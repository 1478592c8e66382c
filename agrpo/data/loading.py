"""Resolve `data.loader` and apply the options every loader shares (prompt cap, shuffling)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import get_method

from agrpo.errors import ConfigError

# With `keep_origin`: each row's index in the loader's output (its order in the file), kept through the shuffle.
ORIGIN_COLUMN = "__agrpo_origin_row"


def load_train_dataset(data_cfg: Any, seed: int, keep_origin: bool = False):
    """Call the configured loader, then shuffle and cap the prompts; fail with the key to fix when it misbehaves.
    `keep_origin` adds ORIGIN_COLUMN (the data checks name a row by where it is in the file, not where the shuffle
    put it)."""
    try:
        loader = get_method(data_cfg.loader)
    except Exception as error:  # Hydra wraps import errors in its own type
        raise ConfigError(f"data.loader={data_cfg.loader!r} cannot be imported: {error}") from None
    missing = missing_data_path(data_cfg.path)
    if missing:
        raise ConfigError(missing)
    dataset = checked_dataset(loader(data_cfg, seed=seed), data_cfg, f"data.loader={data_cfg.loader!r}")
    if keep_origin:
        dataset = dataset.add_column(ORIGIN_COLUMN, list(range(len(dataset))))
    if data_cfg.shuffle:
        dataset = dataset.shuffle(seed=seed)
    if data_cfg.max_prompts is not None:
        dataset = dataset.select(range(min(data_cfg.max_prompts, len(dataset))))
    return dataset


def checked_dataset(dataset: Any, data_cfg: Any, what: str) -> Any:
    """`dataset` if it is a datasets.Dataset with a `prompt` column (what every loader must return)."""
    names = getattr(dataset, "column_names", None)
    if not isinstance(names, list):
        raise ConfigError(f"{what} returned a {type(dataset).__name__}, not a datasets.Dataset")
    if "prompt" not in names:
        raise ConfigError(f"{what} returned columns {names}; a `prompt` column is required.")
    return dataset


def missing_data_path(path: str | None) -> str | None:
    """Why `data.path` cannot be read (the sentence to show), or None. An unset data_dir interpolates as "None"."""
    if path is None or Path(str(path)).expanduser().exists():
        return None
    if str(path).startswith("None/"):
        return (
            f"data.path={path!r} is built from data_dir, which is not set: pass data_dir=/path/to/data or set "
            "the AGRPO_DATA_DIR environment variable"
        )
    return (
        f"data.path={path!r} does not exist: point data.path (or data_dir / AGRPO_DATA_DIR, when the path is "
        "built from it) at the data"
    )
