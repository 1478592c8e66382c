"""Swappable parts (launchers, adapter stores) live one per module and register themselves on import; the config
names them. This finds the class registered under a name, importing `<package>.<name>` on first use."""

from __future__ import annotations

import importlib
from typing import TypeVar

from agrpo.errors import ConfigError

T = TypeVar("T")


def lookup(registry: dict[str, T], package: str, name: str, config_key: str) -> T:
    """registry[name] after importing `<package>.<name>`; a ConfigError naming `config_key` when there is none.

    A ModuleNotFoundError raised *inside* the plugin (a missing dependency) propagates: it is not "no such plugin".
    """
    module = f"{package}.{name}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
    if name not in registry:
        import pkgutil

        for found in pkgutil.iter_modules(importlib.import_module(package).__path__):  # register every plugin
            try:
                importlib.import_module(f"{package}.{found.name}")
            except ImportError:  # a plugin whose dependency is missing is not an option here
                continue
        raise ConfigError(f"{config_key}={name!r} is not one of {sorted(registry)}: pick one of them")
    return registry[name]
