"""The typed run spec: a frozen `RunConfig` (agrpo/config/schema/), what `prepare` returns and every process reads.

Hydra composes on mutable copies of the schema (`composable`); `resolve` turns the validated, composed config into the
spec with `spec_of`: the schema's own frozen dataclasses, each choice field an Enum member, each derived value filled.
Its lists and dicts stay plain lists and dicts (fresh copies the spec owns: TRL, argparse and json take them as they
are); nothing downstream changes them, and a field cannot be rebound. A value changes by `with_values` (a copy), in
the few places that own the change (a Jobs config's role, URLs and inputs, a requeued trainer Job's resume, a replica
node's host, eval's test split).

`<run_dir>/config.yaml` is `spec_yaml(spec)`; `load_spec(path)` reads it back (the trainer process), and
`read_config(path)` gives the mutable composed form for a process that prepares it again (the trainer Job, on its own
machine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from agrpo.config.schema import RunConfig
from agrpo.config.schema.knobs import choice_type, composable, hints, nested_group

T = TypeVar("T")


def build(schema: type[T], values: Mapping[str, Any]) -> T:
    """A frozen `schema` instance from a plain container (`OmegaConf.to_container`): nested groups built in turn,
    choice values as members, keys the container lacks at the schema's default. A key the schema lacks is a
    TypeError: the caller validated the config."""
    types_of = hints(schema)
    fields = {field.name for field in dataclasses.fields(schema)}  # type: ignore[arg-type]
    kwargs = {name: typed(types_of[name], value) for name, value in values.items() if name in fields}
    stray = sorted(set(values) - fields)
    if stray:
        raise TypeError(f"{schema.__name__} has no field(s) {stray}")
    return schema(**kwargs)


def typed(hint: Any, value: Any) -> Any:
    """`value` as the schema's `hint` holds it: a nested group built, a choice as its member."""
    group = nested_group(hint)
    if group is not None and isinstance(value, Mapping):
        return build(group, value)
    enum = choice_type(hint)
    if enum is not None and value is not None:
        return enum(value)  # a member passes through; text names it (`info` is INFO: LogLevel._missing_)
    return value


def spec_of(cfg: DictConfig) -> RunConfig:
    """The spec of a composed (or read) config: every interpolation resolved, nothing derived (resolve does that)."""
    return build(RunConfig, OmegaConf.to_container(cfg, resolve=True))


def with_values(spec: T, changes: Mapping[str, Any]) -> T:
    """A copy of `spec` with each dotted key set to its value, typed by the schema. A key may go into a list or a
    dict the spec holds (`"reward.funcs.0._target_"`, as OmegaConf.update takes it); the containers on the way are
    copied, never changed."""
    for key, value in changes.items():
        spec = replaced(spec, key.split("."), value)
    return spec


def replaced(node: Any, path: list[str], value: Any) -> Any:
    name, *rest = path
    if isinstance(node, list):
        copy, index = list(node), int(name)
        copy[index] = replaced(copy[index], rest, value) if rest else value
        return copy
    if isinstance(node, dict):
        return {**node, name: replaced(node[name], rest, value) if rest else value}
    if rest:
        value = replaced(getattr(node, name), rest, value)
    else:
        value = typed(hints(type(node))[name], value)
    return dataclasses.replace(node, **{name: value})


def select(spec: Any, key: str) -> Any:
    """The value at dotted `key` (`"model.chat_template"`, `"reward.funcs.0"`)."""
    node = spec
    for name in key.split("."):
        if isinstance(node, list):
            node = node[int(name)]
        elif isinstance(node, dict):
            node = node[name]
        else:
            node = getattr(node, name)
    return node


def as_dict(spec: Any) -> dict[str, Any]:
    """The spec (or one of its groups) as plain containers, choice values as text."""
    return OmegaConf.to_container(OmegaConf.structured(spec), enum_to_str=True)  # type: ignore[return-value]


def spec_yaml(spec: RunConfig) -> str:
    """What `<run_dir>/config.yaml` holds: every value, choice members written as their text."""
    return OmegaConf.to_yaml(OmegaConf.structured(spec))


def write_spec(spec: RunConfig, path: str | Path) -> None:
    Path(path).write_text(spec_yaml(spec))


def read_config(path: str | Path) -> DictConfig:
    """A config.yaml merged onto the composable schema: mutable, typed as Hydra composes, keys an older file lacks at
    their default."""
    return config_of_text(Path(path).read_text())


def config_of_text(text: str) -> DictConfig:
    return OmegaConf.merge(OmegaConf.structured(composable(RunConfig)), OmegaConf.create(text))


def load_spec(path: str | Path) -> RunConfig:
    """The spec a run's config.yaml holds (written by `spec_yaml`, so already resolved: nothing is derived again)."""
    return spec_of(read_config(path))
