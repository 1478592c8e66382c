"""Math datasets (GSM8K, MATH "Sanity", AIME 2024/2025, or any local file) as chat prompts plus a gold ``answer``.

Every loader returns a ``datasets.Dataset`` with exactly three columns: ``prompt`` (chat messages), ``problem`` (the
statement, for evaluation records) and ``answer`` (the gold final answer, a string; GSM8K's is the number after
``####``). The accuracy rewards in ``agrpo.rewards.math`` read ``answer``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agrpo.data.jsonl_lines import jsonl_row_lines, mixed_column, row_label
from agrpo.data.prompts import DEFAULT_INSTRUCTION, build_prompt, problem_text
from agrpo.rewards.answers import gsm8k_gold

# Where a source may keep its problem and its gold answer; the first column present wins. Dotted names reach into a
# struct column (Sanity's Hub copy keeps the gold in ``reward_model.ground_truth``, in verl's layout).
PROBLEM_COLUMNS = ("problem", "question", "prompt")
ANSWER_COLUMNS = ("answer", "ground_truth", "reward_model.ground_truth")

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".csv")


@dataclass(frozen=True)
class HubSource:
    """A dataset known by a short name: where it lives on the Hub, and its only split if it has just one."""

    repo_id: str
    config_name: str | None = None
    only_split: str | None = None


KNOWN_DATASETS: dict[str, HubSource] = {
    "gsm8k": HubSource("openai/gsm8k", "main"),
    "sanity": HubSource("sail/Sanity-Test-R1D-1.5B", only_split="train"),
    "aime_2024": HubSource("HuggingFaceH4/aime_2024", only_split="train"),
    "aime_2025": HubSource("yentinglin/aime_2025", only_split="train"),
}


def is_local(name_or_path: str | os.PathLike) -> bool:
    """Whether to read a local file or folder rather than the Hub: it exists, or it is named like a data file."""
    path = Path(name_or_path)
    return path.exists() or path.suffix in LOCAL_SUFFIXES


def read_local(path: str | os.PathLike, split: str = "train"):
    """A local JSONL/JSON, Parquet, CSV or Arrow file, or a folder written by ``save_to_disk``, as one Dataset.

    Files are one split each, so ``split`` only picks from a saved ``DatasetDict`` folder.
    """
    import datasets

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no dataset file at {path}")
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
    if path.suffix == ".arrow":
        return datasets.Dataset.from_file(str(path))
    builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
    if builder is None:
        raise ValueError(f"cannot read {path}: use one of {', '.join(LOCAL_SUFFIXES)} or a save_to_disk folder")
    if path.suffix == ".jsonl":
        jsonl_row_lines(path)  # a broken line or an empty file, named with its line (pyarrow names neither)
    elif path.stat().st_size == 0:
        raise ValueError(f"{path} is empty")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as error:  # pyarrow's "Expected object or value" names no line: find it
        text = path.read_text(encoding="utf-8") if path.suffix == ".jsonl" else ""
        mixed = mixed_column(text, path) if text else None
        if mixed is None and text and any(not line.strip() for line in text.splitlines()):
            # datasets 4.x's JSON reader stops at a blank line ("Expected object or value"); 5.x skips it. Every line
            # is one object (jsonl_row_lines above), so the rows are read one by one instead.
            return datasets.Dataset.from_list([json.loads(line) for line in text.splitlines() if line.strip()])
        if mixed is None:
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{mixed} (the reader said: {first})") from None


def local_row_label(path: str | os.PathLike) -> Callable[[int], str]:
    """How an error names a row of the local file `path` as read: its line for a JSONL file, else its index."""
    return row_label(path, jsonl_row_lines(path) if Path(path).suffix == ".jsonl" else None)


def read_hub(name: str, split: str = "train", config_name: str | None = None):
    """A Hub dataset by short name (``KNOWN_DATASETS``) or repo id; single-split sets ignore ``split``."""
    import datasets

    source = KNOWN_DATASETS.get(name, HubSource(name, config_name))
    return datasets.load_dataset(source.repo_id, config_name or source.config_name, split=source.only_split or split)


def _get(row: Mapping[str, Any], column: str) -> Any:
    value: Any = row
    for key in column.split("."):
        value = value[key]
    return value


def _has(row: Mapping[str, Any], column: str) -> bool:
    try:
        _get(row, column)
    except (KeyError, TypeError):
        return False
    return True


def _pick(row: Mapping[str, Any], wanted: str | None, candidates: tuple[str, ...], role: str) -> str:
    if wanted is not None:
        if not _has(row, wanted):
            raise KeyError(f"no {role} column {wanted!r} in columns {sorted(row)}")
        return wanted
    for column in candidates:
        if _has(row, column):
            return column
    raise KeyError(f"no {role} column among {candidates} in columns {sorted(row)}; name it in the column mapping")


def gold_answer(value: Any) -> str:
    """A gold answer as the rewards want it: a string, GSM8K's solution cut to the number after its ``####``."""
    return gsm8k_gold(str(value))


def to_math_rows(
    dataset,
    *,
    columns: Mapping[str, str] | None = None,
    system_prompt: str | None = None,
    instruction: str | None = DEFAULT_INSTRUCTION,
    where: Callable[[int], str] | None = None,
):
    """Reshape any dataset of problems and answers into ``prompt``, ``problem`` and ``answer`` columns.

    ``columns`` maps source columns to ``problem`` and ``answer`` (``{"question": "problem"}``); unmapped roles are
    found among ``PROBLEM_COLUMNS`` and ``ANSWER_COLUMNS``. A row that cannot be read is a ValueError naming it with
    ``where`` (its line in a JSONL file; default: its index).
    """
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    by_role = {role: source for source, role in (columns or {}).items()}
    unknown = set(by_role) - {"problem", "answer"}
    if unknown:
        raise ValueError(f"column mapping targets must be 'problem' or 'answer', got {sorted(unknown)}")
    first = dataset[0]
    problem_column = _pick(first, by_role.get("problem"), PROBLEM_COLUMNS, "problem")
    answer_column = _pick(first, by_role.get("answer"), ANSWER_COLUMNS, "answer")

    label = where or (lambda index: f"row {index} (counting from 0)")

    def convert(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        try:
            problem, answer = _get(row, problem_column), _get(row, answer_column)
            for column, value in ((problem_column, problem), (answer_column, answer)):
                if value is None:
                    raise ValueError(f"column {column!r} is null or missing")
            problem = problem_text(problem, instruction)
        except (KeyError, TypeError, ValueError) as error:
            what = error.args[0] if isinstance(error, KeyError) and error.args else error  # KeyError's str() quotes
            raise ValueError(f"{label(index)}: {what}") from None
        return {
            "prompt": build_prompt(problem, system_prompt, instruction),
            "problem": problem,
            "answer": gold_answer(answer),
        }

    return dataset.map(convert, with_indices=True, remove_columns=dataset.column_names, desc="formatting math prompts")


def load_math_dataset(
    name_or_path: str | os.PathLike,
    split: str = "train",
    *,
    config_name: str | None = None,
    columns: Mapping[str, str] | None = None,
    system_prompt: str | None = None,
    instruction: str | None = DEFAULT_INSTRUCTION,
):
    """A math dataset as chat prompts and gold answers, from a short name, a Hub repo id or a local file.

    Short names: ``gsm8k``, ``sanity``, ``aime_2024``, ``aime_2025`` (see ``KNOWN_DATASETS``). A path that exists or
    ends in a data-file suffix is read locally, with no network (tests and offline machines use this).
    """
    if is_local(name_or_path):
        raw, where = read_local(name_or_path, split), local_row_label(name_or_path)
    else:
        raw, where = read_hub(str(name_or_path), split, config_name), row_label(f"{name_or_path} ({split})", None)
    return to_math_rows(raw, columns=columns, system_prompt=system_prompt, instruction=instruction, where=where)


def load_math(data_cfg: Any, seed: int = 0):
    """The ``data.loader`` entry: ``data.path`` (local) wins over ``data.name`` (short name or Hub id).

    ``seed`` is unused: shuffling and capping are the caller's (``agrpo.data.loading``).
    """
    source = data_cfg.path or data_cfg.name
    if not source:
        raise ValueError("set data.name (a Hub dataset or a short name like gsm8k) or data.path (a local file)")
    instruction = DEFAULT_INSTRUCTION if data_cfg.instruction is None else data_cfg.instruction
    return load_math_dataset(
        source,
        data_cfg.split,
        config_name=data_cfg.config_name,
        columns=dict(data_cfg.columns or {}),
        system_prompt=data_cfg.system_prompt,
        instruction=instruction or None,
    )
