"""Schema fields that code can read: `knob(default, doc=...)` declares one, `walk` lists them with their dotted keys.

The doc of each field is dataclass field metadata under "help" (the key agrpo/proxy/settings.py uses for the proxy's
own knobs), so `python -m agrpo --help GROUP`, `agrpo eval --help` and docs/config.md (agrpo/config/reference.py) all
read the same words.

The schema's classes are frozen: an instance is the typed run spec `prepare` returns (agrpo/config/spec.py).
`composable(schema)` is the schema Hydra composes on: mutable copies of the same classes with every choice field typed
`str`, so overrides merge into it and a bad name reaches the validation pass and gets its one-paragraph message (exit
2, naming the key) instead of OmegaConf's merge error, with every other problem listed beside it. (OmegaConf cannot
merge into a structured config of a frozen class, nested ones included.) `resolve` (agrpo/config/resolve.py) then
builds the frozen spec from the validated config, each choice field holding its enum member.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from enum import Enum
from typing import Any, Callable, Iterator, Optional


HELP = "help"
_UNSET: Any = object()


def knob(default: Any = _UNSET, *, doc: str, factory: Callable[[], Any] | None = None) -> Any:
    """A schema field with its default (or `factory` for a mutable one) and the one-line why `doc`."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={HELP: doc})
    return dataclasses.field(default=default, metadata={HELP: doc})


def group(schema: type) -> Any:
    """A field holding a nested group: its default is a fresh `schema()`, its doc the class docstring."""
    return dataclasses.field(default_factory=schema, metadata={HELP: (schema.__doc__ or "").strip()})


def doc_of(field: dataclasses.Field) -> str:
    return " ".join(str(field.metadata.get(HELP, "")).split())


@dataclasses.dataclass(frozen=True)
class Knob:
    """One leaf key of the schema: `key` dotted from the root, `hint` its type, `field` its dataclass field."""

    key: str
    hint: Any
    field: dataclasses.Field

    @property
    def doc(self) -> str:
        return doc_of(self.field)

    @property
    def default(self) -> Any:
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return self.field.default

    @property
    def choices(self) -> type[Enum] | None:
        return choice_type(self.hint)


def hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def nested_group(hint: Any) -> type | None:
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def walk(schema: type, prefix: str = "") -> Iterator[Knob]:
    """Every leaf key under `schema`, depth first, in declaration order."""
    types_of = hints(schema)
    for field in dataclasses.fields(schema):
        hint = types_of[field.name]
        inner = nested_group(hint)
        if inner is not None:
            yield from walk(inner, f"{prefix}{field.name}.")
        else:
            yield Knob(f"{prefix}{field.name}", hint, field)


def groups(schema: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(dotted prefix, class) of every nested group under `schema`, the root first ("" prefix)."""
    yield prefix, schema
    types_of = hints(schema)
    for field in dataclasses.fields(schema):
        inner = nested_group(types_of[field.name])
        if inner is not None:
            yield from groups(inner, f"{prefix}{field.name}.")


def choice_type(hint: Any) -> type[Enum] | None:
    """The Enum of a choice field's hint (`E`, `Optional[E]`), else None."""
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [choice_type(arg) for arg in typing.get_args(hint)]
        return next((enum for enum in found if enum is not None), None)
    return None


def choice_fields(schema: type) -> dict[str, type[Enum]]:
    """Dotted key -> Enum, for every choice field under `schema`."""
    return {knob.key: knob.choices for knob in walk(schema) if knob.choices is not None}


def loose(hint: Any) -> Any:
    """`hint` with an Enum replaced by str and a nested group by its composable copy."""
    if choice_type(hint) is not None:
        return Optional[str] if type(None) in typing.get_args(hint) else str
    inner = nested_group(hint)
    return composable(inner) if inner is not None else hint


COMPOSED_HOME = "agrpo.config.schema.composed"  # the module pickle imports to find a composable copy
COMPOSED: dict[str, type] = {}  # "ComposableTrainerConfig" -> the copy, as `composable` built it


@functools.cache
def composable(schema: type) -> type:
    """`schema` as Hydra composes it: a mutable copy (also of each nested group), each choice field typed `str`, defaults
    as text."""
    types_of = hints(schema)
    fields = []
    for field in dataclasses.fields(schema):
        hint = loose(types_of[field.name])
        if nested_group(types_of[field.name]) is not None:
            spec = dataclasses.field(default_factory=hint, metadata=field.metadata)
        elif field.default_factory is not dataclasses.MISSING:
            spec = dataclasses.field(default_factory=field.default_factory, metadata=field.metadata)
        else:
            default = field.default.value if isinstance(field.default, Enum) else field.default
            spec = dataclasses.field(default=default, metadata=field.metadata)
        fields.append((field.name, hint, spec))
    # Its own name in messages (Hydra's "object_type=TrainerConfig"); pickle finds it by its qualified name in
    # COMPOSED_HOME (agrpo/config/schema/composed.py), which builds the copies in a process that has none yet.
    home = f"Composable{schema.__name__}"
    namespace = {"__doc__": schema.__doc__, "__module__": COMPOSED_HOME, "__qualname__": home}
    copy = dataclasses.make_dataclass(schema.__name__, fields, namespace=namespace)
    COMPOSED[home] = copy
    return copy


def as_members(values: dict[str, Any], schema: type) -> dict[str, Any]:
    """A plain config dict (`OmegaConf.to_container`) with each choice value replaced by its member, found by value
    (`logger.level=info` is INFO), so merging it into `OmegaConf.structured(schema)` accepts what validation passed.
    A value no member names is left as it is (the merge then refuses it)."""
    for key, enum in choice_fields(schema).items():
        *path, name = key.split(".")
        node: Any = values
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(name) is not None:
            member = enum.parse(node[name])  # type: ignore[attr-defined]
            node[name] = member if member is not None else node[name]
    return values
