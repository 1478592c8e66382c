"""`data=hub`: a Hugging Face Hub dataset by name, shaped like data=jsonl (a chat `prompt` plus every other column).

`data.name` goes to `datasets.load_dataset` as is, so a local folder of data files works too (tests, offline
machines); the rows are then mapped exactly as for a JSONL file (agrpo/data/jsonl.py).
"""

from __future__ import annotations

from typing import Any

from agrpo.data.jsonl import task_rows_from_config
from agrpo.data.jsonl_lines import row_label
from agrpo.errors import ConfigError


def load_hub(data_cfg: Any, seed: int = 0):
    """The `data.loader` of data=hub: `data.name` (repo id), `data.config_name`, `data.split`.

    `data.path` wins when set, as in every loader (a local copy of the same data). `seed` is unused.
    """
    import datasets

    if data_cfg.path:
        from agrpo.data.jsonl import load_jsonl

        return load_jsonl(data_cfg, seed)
    if not data_cfg.name:
        raise ConfigError("data=hub needs data.name=OWNER/DATASET (a Hub dataset id), or data.path=FILE")
    try:
        raw = datasets.load_dataset(data_cfg.name, data_cfg.config_name, split=data_cfg.split)
    except (FileNotFoundError, ValueError, ConnectionError) as error:
        raise ConfigError(
            f"data.name={data_cfg.name!r} (config {data_cfg.config_name!r}, split "
            f"{data_cfg.split!r}) could not be loaded: {error}"
        ) from None
    return task_rows_from_config(raw, data_cfg, row_label(f"{data_cfg.name} ({data_cfg.split})", None))
