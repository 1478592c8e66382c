"""The config reference, generated from the schema: `python -m agrpo.config.reference > docs/config.md` (or `make docs`).

Every key with its type, default, choices and why, read from the field metadata (agrpo/config/schema/knobs.py), so
the reference cannot drift from the schema (tests/config/test_reference.py regenerates it and compares). The same
rendering serves `python -m agrpo --help GROUP` and `agrpo eval --help`.
"""

from __future__ import annotations

import json
import typing
from enum import Enum
from typing import Any

from omegaconf import MISSING

from agrpo.config.schema.knobs import Knob, choice_type, groups, walk

INTRO = """# Config reference

Every key of a run's config, generated from the schema (`agrpo/config/schema/`) by
`python -m agrpo.config.reference > docs/config.md` (`make docs`); do not edit by hand. Set a key on the command line
(`trainer.max_steps=50`), in a recipe, or pick a group option (`sync=bucket`); `python -m agrpo --help GROUP` prints
one group's keys. Defaults shown as `???` must be set (a recipe or group sets them); `${...}` are interpolations,
resolved when the run starts; `null` means "derive it" where the doc says so.
"""


def render_default(value: Any) -> str:
    """A default as it is written in an override: strings quoted, None as null, booleans lowercase."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str):
        return "???" if value == MISSING else json.dumps(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value).replace('"', "")
    return repr(value)


def render_type(hint: Any) -> str:
    """`int`, `str | null`, `list[str]`, `one of: a, b` for a choice field."""
    choices = choice_type(hint)
    if choices is not None:
        optional = " (or null)" if type(None) in typing.get_args(hint) else ""
        return "one of: " + ", ".join(choices.values()) + optional  # type: ignore[attr-defined]
    if isinstance(hint, type):
        return hint.__name__
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [render_type(arg) for arg in args if arg is not type(None)]
        return " | ".join(rest) + " | null"
    return str(hint).replace("typing.", "")


def knob_line(knob: Knob) -> str:
    """`key=default` as --help shows it, with the choices when the field has them."""
    choices = knob.choices
    line = f"{knob.key}={render_default(knob.default)}"
    return f"{line}  ({' | '.join(choices.values())})" if choices is not None else line  # type: ignore[attr-defined]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def group_section(prefix: str, schema: type) -> list[str]:
    """One group's heading, its docstring and a table of its own keys (nested groups get their own section)."""
    heading = f"## `{prefix.rstrip('.')}`" if prefix else "## Top level"
    doc = " ".join((schema.__doc__ or "").split())
    lines = [heading, "", doc, "", "| key | type | default | why |", "|---|---|---|---|"]
    for knob in walk(schema, prefix):
        if knob.key.count(".") != prefix.count("."):
            continue  # a nested group's keys: its own section
        default = f"`{cell(render_default(knob.default))}`"
        lines.append(f"| `{knob.key}` | {cell(render_type(knob.hint))} | {default} | {cell(knob.doc)} |")
    return lines + [""]


def reference_markdown(root: type | None = None) -> str:
    """docs/config.md: one section per group, one row per key, in the schema's order."""
    if root is None:
        from agrpo.config.schema import RunConfig

        root = RunConfig
    lines = [INTRO]
    for prefix, schema in groups(root):
        lines += group_section(prefix, schema)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    print(reference_markdown(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
