"""Environments as the rollout worker needs them, built from `agent.environment`.

The rollout loop (agrpo/trainer/rollout/toolbox.py, under TRL's contract) calls the factory in the spawned rollout
process, pools the instances (one per concurrent rollout, `reset` between rollouts), offers the public methods of the
instance's class as tools, folds what `reset` returns into the last prompt message, and, when the class has
`get_reward`, adds one reward column named after the class.

`EnvironmentFactory` pickles as its `_target_` and options (a class from `my_env.py` cannot be pickled by
reference) and hands TRL an instance of a guarded subclass of the user's class (same name, same methods): each tool
method is guarded like a tool (timeout, result check, length cap: agrpo/agents/tools.py), and a `reset` or
`get_reward` that raises, or runs past `agent.tool_timeout_s` (TRL gives them no limit: a hung `reset` stalled the run
without a word), is re-raised naming the environment and the row it was reset with, so the run stops naming its row.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from agrpo.agents.tools import (
    GuardedTarget,
    ToolTimeout,
    guarded_method,
    load_target,
    run_with_timeout,
    split_entry,
)
from agrpo.errors import AgrpoError, ConfigError

log = logging.getLogger(__name__)
CONTROL_METHODS = ("reset", "get_reward")  # TRL's: never offered to the model as tools
ROW_CHARS = 300  # how much of a row an error shows


class EnvironmentFailed(AgrpoError, RuntimeError):
    """An environment's `reset` or `get_reward` raised (or hung); the message names the environment and the row. An
    AgrpoError, so `agrpo eval` prints it as its one paragraph, as training does."""


def row_text(row: dict[str, Any]) -> str:
    """A row as an error message shows it: its columns, each value cut short."""
    shown = ", ".join(f"{key}={_short(repr(value))}" for key, value in row.items())
    return "{" + (shown if len(shown) <= ROW_CHARS else shown[:ROW_CHARS] + " ...") + "}"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_limited(function: Callable[..., Any], self: Any, args: tuple, kwargs: dict, timeout_s: float | None) -> Any:
    """`function(self, *args, **kwargs)` within `timeout_s` (a daemon thread, as a tool: tools.run_with_timeout)."""
    if timeout_s is None:
        return function(self, *args, **kwargs)
    where = f"{type(self).__name__}.{function.__name__}"
    return run_with_timeout(lambda: function(self, *args, **kwargs), timeout_s, where)


def _failed(self: Any, what: str, row: str, error: BaseException) -> EnvironmentFailed:
    return EnvironmentFailed(f"environment {type(self).__name__}.{what} {row}: {type(error).__name__}: {error}")


def _guarded_reset(function: Callable[..., Any], timeout_s: float | None = None) -> Callable[..., Any]:
    @functools.wraps(function)
    def reset(self, *args: Any, **row: Any) -> Any:
        if hasattr(self, "__dict__"):
            self.__dict__["_agrpo_row"] = row_text(row)
        try:
            return _run_limited(function, self, args, row, timeout_s)
        except Exception as error:
            raise _failed(self, "reset raised on the row", row_text(row), error) from error

    return reset


def _guarded_reward(function: Callable[..., Any], timeout_s: float | None = None) -> Callable[..., Any]:
    """`get_reward` guarded: a sync one runs under the timeout; an async one (TRL awaits it) is awaited under it."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def get_reward_async(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await asyncio.wait_for(function(self, *args, **kwargs), timeout_s)
            except Exception as error:
                row = getattr(self, "__dict__", {}).get("_agrpo_row", "(unknown)")
                if isinstance(error, TimeoutError):
                    where = f"{type(self).__name__}.get_reward"
                    error = ToolTimeout(f"{where} did not return within {timeout_s:g} s (agent.tool_timeout_s)")
                raise _failed(self, "get_reward raised after the row", row, error) from error

        return get_reward_async

    @functools.wraps(function)
    def get_reward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return _run_limited(function, self, args, kwargs, timeout_s)
        except Exception as error:
            row = getattr(self, "__dict__", {}).get("_agrpo_row", "(unknown)")
            raise _failed(self, "get_reward raised after the row", row, error) from error

    return get_reward


@functools.lru_cache(maxsize=None)
def guarded_class(cls: type, timeout_s: float | None, max_chars: int | None = None) -> type:
    """A subclass of `cls` with the same name and layout whose tool methods, reset and get_reward are guarded."""
    namespace: dict[str, Any] = {"__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    for name, function in inspect.getmembers(cls, predicate=inspect.isfunction):
        if not inspect.isfunction(inspect.getattr_static(cls, name)):
            continue  # a staticmethod or classmethod: left as it is
        if name == "reset":
            namespace[name] = _guarded_reset(function, timeout_s)
        elif name == "get_reward":
            namespace[name] = _guarded_reward(function, timeout_s)
        elif not name.startswith("_"):
            namespace[name] = guarded_method(function, timeout_s, max_chars)
    return type(cls.__name__, (cls,), namespace)


def tool_methods(cls: type) -> list[str]:
    """The names TRL offers the model as tools: public functions of the class other than reset/get_reward."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in CONTROL_METHODS and not name.startswith("_")
    ]


class EnvironmentFactory(GuardedTarget):
    """One `agent.environment` factory: called by TRL (in its rollout process) for each new pooled instance."""

    def __init__(
        self,
        target: str,
        options: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_output_chars: int | None = None,
    ):
        super().__init__(target, options, timeout_s, max_output_chars)
        self.factory = load_target(target)
        if not callable(self.factory):
            raise TypeError(f"{target} is a {type(self.factory).__name__}, not a class or factory function")

    def __call__(self) -> Any:
        instance = self.factory(**self.options)
        try:
            instance.__class__ = guarded_class(type(instance), self.timeout_s, self.max_output_chars)
        except TypeError as error:  # a class whose instances cannot change class (C types, odd layouts)
            log.warning("%s's tools run without agrpo's timeout and result checks: %s", self.target, error)
        return instance


def is_single_factory(environment: Any) -> bool:
    """A mapping with `_target_` (or a target string) is one factory; any other mapping names several."""
    return isinstance(environment, str) or (isinstance(environment, dict) and "_target_" in environment)


def factory_entries(environment: Any) -> list[tuple[str | None, str, Any]]:
    """(environment name or None for a single factory, config key, entry) for each factory configured."""
    if environment is None:
        return []
    if is_single_factory(environment):
        return [(None, "agent.environment", environment)]
    if isinstance(environment, dict) and environment:
        return [(str(name), f"agent.environment.{name}", entry) for name, entry in environment.items()]
    raise ConfigError(
        "agent.environment must be {_target_: my_env.py:MyEnv, ...options} or {name: {_target_: ...}, ...}, "
        f"got {environment!r}"
    )


def build_environment(environment: Any, timeout_s: float | None, max_chars: int | None = None):
    """`agent.environment` as TRL's `environment_factory`: one factory, a {name: factory} mapping, or None."""
    built: dict[str | None, EnvironmentFactory] = {}
    for name, key, entry in factory_entries(environment):
        target, options = split_entry(entry, key)
        try:
            built[name] = EnvironmentFactory(target, options, timeout_s, max_chars)
        except Exception as error:  # any failure to load is the user's to fix; say which
            raise ConfigError(f"{key}={target!r} cannot be loaded as an environment factory: {error}") from None
    if not built:
        return None
    return built[None] if None in built else built
