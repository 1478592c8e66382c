"""Your own task with no Python (`data=jsonl`): rows holding a `prompt` (text or chat messages) and any other columns.

Every column but `prompt` reaches each reward function as a keyword argument: TRL's async rollout worker passes a
row's other columns to the rewards, repeated once per completion. So a reward config names the column it reads
(`agrpo/rewards/generic.py`), and nothing here needs to know what the task is. See docs/your_task.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agrpo.errors import ConfigError

# Names TRL passes to every reward itself (or drops from the row): a dataset column of that name would collide.
RESERVED_COLUMNS = ("completions", "prompts", "completion", "completion_ids")
ROLES = ("system", "user", "assistant", "tool")


def rename_columns(dataset, columns: Mapping[str, str]):
    """`data.columns` ({source: target}) applied to the dataset; a source that is not there is a ConfigError."""
    if not columns:
        return dataset
    missing = sorted(set(columns) - set(dataset.column_names))
    if missing:
        raise ConfigError(f"data.columns renames {missing}, but the dataset's columns are {dataset.column_names}")
    return dataset.rename_columns(dict(columns))


def chat_messages(value: Any) -> list[dict[str, str]]:
    """A prompt as chat messages: a string becomes one user turn; a list must already be {role, content} dicts."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        raise ConfigError(
            "the prompt is null or missing: a prompt is text or a list of chat messages like "
            "[{'role': 'user', 'content': '...'}]"
        )
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        messages = [{"role": str(m.get("role")), "content": m.get("content")} for m in value]
        for message in messages:
            if message["role"] not in ROLES or not isinstance(message["content"], str):
                raise ConfigError(
                    f"a chat prompt needs messages like {{'role': 'user', 'content': '...'}} (roles "
                    f"{', '.join(ROLES)}), got {value!r}"
                )
        return messages
    raise ConfigError(f"a prompt must be text or a list of chat messages, got {type(value).__name__}: {value!r}")


def render_prompt(
    row: Mapping[str, Any],
    *,
    template: str | None = None,
    system_prompt: str | None = None,
    instruction: str | None = None,
) -> list[dict[str, str]]:
    """One row's prompt as chat messages.

    `template` (a Python format string over the row's columns) wins over the row's `prompt`; `instruction` is appended
    to the last user turn after a space; `system_prompt` is put first unless the row brings its own system turn.
    """
    if template is not None:
        try:
            value: Any = template.format_map(row)
        except (KeyError, IndexError) as error:
            raise ConfigError(
                f"data.prompt_template={template!r} names {error}, which is not a column; the columns are {sorted(row)}"
            ) from None
    elif "prompt" in row:
        value = row["prompt"]
    else:
        raise ConfigError(
            f"the rows hold no `prompt` column (columns: {sorted(row)}): rename one with "
            "+data.columns.your_column=prompt, or build it with data.prompt_template='...{your_column}'"
        )
    messages = chat_messages(value)
    if instruction:
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if users:
            last = messages[users[-1]]
            messages[users[-1]] = {"role": "user", "content": f"{last['content']} {instruction}"}
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def to_task_rows(
    dataset,
    *,
    columns: Mapping[str, str] | None = None,
    prompt_template: str | None = None,
    system_prompt: str | None = None,
    instruction: str | None = None,
    where: Callable[[int], str] | None = None,
):
    """Rename columns, then build a chat `prompt` per row; every other column is kept as is, for the rewards. A row
    whose prompt cannot be built is a ConfigError naming it with `where` (its line in a JSONL file; default: its
    index)."""
    if len(dataset) == 0:
        raise ConfigError("the dataset has no rows")
    dataset = rename_columns(dataset, columns or {})
    clashes = [name for name in RESERVED_COLUMNS if name in dataset.column_names]
    if clashes:
        raise ConfigError(
            f"column(s) {clashes} clash with the arguments TRL passes to every reward; rename them "
            f"with +data.columns.{clashes[0]}=another_name"
        )
    label = where or (lambda index: f"row {index} (counting from 0)")

    def convert(row: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            prompt = render_prompt(row, template=prompt_template, system_prompt=system_prompt, instruction=instruction)
        except ConfigError as error:
            raise ConfigError(f"{label(index)}: {error}") from None
        return {"prompt": prompt}

    convert(dataset[0], 0)  # a template naming no column fails here, before any map
    remove = ["prompt"] if "prompt" in dataset.column_names else []
    return dataset.map(convert, with_indices=True, remove_columns=remove, desc="formatting prompts")


def task_rows_from_config(raw, data_cfg: Any, where: Callable[[int], str] | None = None):
    """`to_task_rows` with the `data.*` keys (shared by the jsonl and hub loaders)."""
    return to_task_rows(
        raw,
        columns=dict(data_cfg.columns or {}),
        prompt_template=data_cfg.prompt_template,
        system_prompt=data_cfg.system_prompt,
        instruction=data_cfg.instruction,
        where=where,
    )


def config_problems(data_cfg: Any) -> list[str]:
    """What is wrong with data=jsonl / data=hub settings before anything starts (the trainer loads the data only
    after the replicas are up): no source, or a local file that is not there."""
    from pathlib import Path

    loader = str(data_cfg.loader)
    if loader.endswith(".load_jsonl") and not data_cfg.path:
        return ["data=jsonl needs data.path=FILE (a JSONL file with a `prompt` and the columns your rewards read)"]
    if loader.endswith(".load_hub") and not (data_cfg.path or data_cfg.name):
        return ["data=hub needs data.name=OWNER/DATASET (a Hub dataset id), or data.path=FILE"]
    if loader.endswith((".load_jsonl", ".load_hub")) and data_cfg.path and not Path(data_cfg.path).exists():
        return [f"data.path={data_cfg.path!r} does not exist (relative paths are from {Path.cwd()})"]
    return []


def load_jsonl(data_cfg: Any, seed: int = 0):
    """The `data.loader` of data=jsonl: `data.path`, a JSONL file (or JSON, Parquet, CSV, Arrow, a saved folder).

    `seed` is unused: shuffling and capping are the caller's (agrpo.data.loading).
    """
    from agrpo.data.math import local_row_label, read_local

    if not data_cfg.path:
        raise ConfigError(
            "data=jsonl needs data.path=FILE (a JSONL file, one JSON object per line with a `prompt` "
            "and the columns your rewards read)"
        )
    try:
        raw, where = read_local(data_cfg.path, data_cfg.split), local_row_label(data_cfg.path)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"data.path={data_cfg.path!r}: {error}") from None
    return task_rows_from_config(raw, data_cfg, where)
