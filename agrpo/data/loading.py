"""Resolve `data.loader` and apply the options every loader shares (prompt cap, shuffling)."""

from __future__ import annotations

from typing import Any

from hydra.utils import get_method

from agrpo.errors import ConfigError


def load_train_dataset(data_cfg: Any, seed: int):
    """Call the configured loader, then shuffle and cap the prompts; fail with the key to fix when it misbehaves."""
    try:
        loader = get_method(data_cfg.loader)
    except Exception as error:  # Hydra wraps import errors in its own type
        raise ConfigError(f"data.loader={data_cfg.loader!r} cannot be imported: {error}") from None
    dataset = loader(data_cfg, seed=seed)
    if "prompt" not in dataset.column_names:
        raise ConfigError(
            f"data.loader={data_cfg.loader!r} returned columns {dataset.column_names}; a `prompt` column is required."
        )
    if data_cfg.shuffle:
        dataset = dataset.shuffle(seed=seed)
    if data_cfg.max_prompts is not None:
        dataset = dataset.select(range(min(data_cfg.max_prompts, len(dataset))))
    return dataset
