"""A bounded sample of the training rows, for the checks that run before any replica starts.

A local file (and the synthetic smoke task) is opened whole, as training opens it. Otherwise the data comes from
somewhere slower, and the check takes only a sample, in bounded time:

- `data=hub` (`agrpo.data.hub.load_hub` without `data.path`): the first `SAMPLE_ROWS` rows of the split, streamed
  (`datasets.load_dataset(..., streaming=True)`: only those rows are downloaded), mapped as training maps them;
- a loader of one's own (`data.loader: my_data.load`, anything outside agrpo.data): called as the trainer calls it,
  with `data.max_prompts` capped at `SAMPLE_ROWS` (a loader that honours it loads less);
- agrpo's own Hub mappings (`agrpo.data.math.load_math`: gsm8k, MATH, AIME without a local copy) are not opened:
  their columns are fixed by agrpo, and the trainer downloads them.

Each waits at most `timeout_s` (a daemon thread: a loader that hangs is left behind, never waited for); past it, or
when the Hub cannot be reached from here (offline, no network), the rows are not checked here and the caller says
so in one line: the trainer loads them as before. Any other failure is the data's own, and is reported.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agrpo.timeouts import call_within

SAMPLE_ROWS = 256  # rows a check opens from the Hub or from a loader of one's own
SAMPLE_TIMEOUT_S = 60.0  # how long a check waits for them


class SampleUnavailable(Exception):
    """The sample could not be had here (timeout, no network): not the data's fault; the trainer checks it."""


def sample_source(data_cfg: Any) -> str | None:
    """How the checks open the training data: "whole" (a local file, the smoke task), "hub" (streamed sample),
    "loader" (a loader of one's own, sampled) or None (not opened here: agrpo's own Hub mappings)."""
    loader = str(data_cfg.loader)
    if loader.endswith(".load_smoke_dataset"):
        return "whole"
    if data_cfg.path:
        return "whole" if Path(str(data_cfg.path)).expanduser().exists() else None
    if loader == "agrpo.data.hub.load_hub":
        return "hub" if data_cfg.name else None
    if loader.startswith("agrpo.data."):
        return None
    return "loader"


def within(run: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`run()` waiting at most `timeout_s` (then SampleUnavailable; the thread is left: agrpo/timeouts.py)."""
    return call_within(
        run, timeout_s, "agrpo-data-sample", lambda: SampleUnavailable(f"{what} gave no rows within {timeout_s:g} s")
    )


def unreachable(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the Hub or the network cannot be reached from here."""
    while error is not None:
        if isinstance(error, (ConnectionError, TimeoutError)) or "offline" in type(error).__name__.lower():
            return True
        error = error.__cause__ or error.__context__
    return False


def hub_rows(data_cfg: Any, rows: int) -> Any:
    """The first `rows` rows of `data.name`'s split, streamed, as a Dataset mapped as data=hub maps them."""
    import datasets

    from agrpo.data.jsonl import task_rows_from_config

    stream = datasets.load_dataset(data_cfg.name, data_cfg.config_name, split=data_cfg.split, streaming=True)
    taken = list(stream.take(rows))
    if not taken:
        raise ValueError(f"split {data_cfg.split!r} has no rows")
    return task_rows_from_config(datasets.Dataset.from_list(taken), data_cfg)


def load_sample(data_cfg: Any, seed: int, keep_origin: bool, timeout_s: float | None = None) -> Any:
    """The rows the checks see (see the module docstring), waiting at most `timeout_s` (default SAMPLE_TIMEOUT_S).
    Raises SampleUnavailable when they cannot be had here, ConfigError or the loader's own error when the data is
    wrong."""
    from agrpo.data.loading import ORIGIN_COLUMN, checked_dataset, load_train_dataset

    source, timeout_s = sample_source(data_cfg), timeout_s or SAMPLE_TIMEOUT_S
    if source == "whole":
        return load_train_dataset(data_cfg, seed=seed, keep_origin=keep_origin)
    if source is None:
        raise SampleUnavailable("agrpo's own mapping: the trainer loads it")
    try:
        if source == "hub":
            what = f"data.name={data_cfg.name!r}"
            dataset = within(lambda: hub_rows(data_cfg, SAMPLE_ROWS), timeout_s, what)
            dataset = checked_dataset(dataset, data_cfg, what)
            return dataset.add_column(ORIGIN_COLUMN, list(range(len(dataset)))) if keep_origin else dataset
        sampled = copy.deepcopy(data_cfg)
        sampled.max_prompts = min(data_cfg.max_prompts or SAMPLE_ROWS, SAMPLE_ROWS)
        what = f"data.loader={data_cfg.loader!r}"
        return within(lambda: load_train_dataset(sampled, seed=seed, keep_origin=keep_origin), timeout_s, what)
    except SampleUnavailable:
        raise
    except Exception as error:
        if unreachable(error):
            raise SampleUnavailable(f"{what} cannot be reached from here ({type(error).__name__})") from None
        raise
