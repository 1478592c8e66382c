"""Tools as the rollout worker needs them, built from `agent.tools` entries named as rewards are.

The chat template renders each tool's schema from its name, type hints and docstring (transformers' `get_json_schema`
takes only functions and bound methods); the rollout loop calls it in a thread of the spawned rollout process (so
every tool is pickled) and turns what it raises into a tool message the model sees, counted under
`tools/<name>/failure_total` (agrpo/trainer/rollout/toolbox.py).

`GuardedTool` gives all three to a function from a file (`my_tools.py:search`), a dotted path or a mapping with bound
options: `.method` is a bound method with the function's own name, signature and docstring; it pickles as its `_target_`
and is rebuilt in the child (a function loaded from a file could not be pickled by reference); and `call_guarded` wraps
every call, so a tool that hangs past `agent.tool_timeout_s` or returns something no tool message can carry raises,
which the rollout loop reports to the model and counts, instead of stalling or killing the run; and an answer longer
than `agent.max_tool_output_chars` is cut there with a marker (`capped`), so one tool returning megabytes cannot push
the next turn past the context (agrpo's rollout loop counts the cut answers).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import inspect
import json
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import MethodType
from typing import Any

from agrpo.errors import ConfigError
from agrpo.timeouts import call_within


CUT_MARK = "characters cut by agrpo (agent.max_tool_output_chars="  # in every cut answer: the loop counts them


def served_doc(doc: str | None) -> str | None:
    """A tool's docstring without its `Returns:` section (pure). transformers turns that section (and a return
    type hint) into a `return` key of the schema, which TRL renders into training prompts, but OpenAI's tool format
    (vLLM's chat API) has no such key and drops it: without it, a served request lists the tools as training did."""
    if doc is None:
        return None
    kept, header = [], None
    for line in doc.split("\n"):
        indent = len(line) - len(line.lstrip())
        if header is not None and (not line.strip() or indent > header):
            continue  # inside the section
        header = indent if line.strip() == "Returns:" else None
        if header is None:
            kept.append(line)
    return "\n".join(kept)


def served_annotations(annotations: dict[str, Any]) -> dict[str, Any]:
    """Type hints without the return's (served_doc says why), in a new dict."""
    return {k: v for k, v in annotations.items() if k != "return"}


class ToolTimeout(TimeoutError):
    """A tool call ran past `agent.tool_timeout_s`; the turn ends with this error as the tool's answer."""


def load_target(target: str) -> Any:
    """The object a `_target_` names: `file.py:name`, or a dotted path (resolved as reward targets are: from the
    working directory too). A file is executed once per process, so entries naming the same class get the same
    class (TRL tells environments apart by class)."""
    if ":" not in target:
        from agrpo.rewards.registry import resolve_target

        return resolve_target(target)
    path, _, name = target.rpartition(":")
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"no file {path!r} (relative paths are from {Path.cwd()})")
    module = _file_module(str(file.resolve()))
    if not hasattr(module, name):
        raise AttributeError(f"{file} defines no {name!r}")
    return getattr(module, name)


@functools.lru_cache(maxsize=None)
def _file_module(path: str) -> Any:
    """The module of a user's file, registered under a name of its own (dataclasses and pickle look modules up)."""
    name = "agrpo_user_code_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def split_entry(entry: Any, key: str) -> tuple[str, dict[str, Any]]:
    """(`_target_`, bound options) of a config entry: a target string, or a mapping with `_target_`."""
    if isinstance(entry, str) and entry:
        return entry, {}
    if isinstance(entry, dict) and isinstance(entry.get("_target_"), str):
        options = {k: v for k, v in entry.items() if k != "_target_"}
        return entry["_target_"], options
    raise ConfigError(f"{key} must be `file.py:function`, a dotted path or a mapping with `_target_`, got {entry!r}")


def run_with_timeout(run: Callable[[], Any], timeout_s: float, name: str) -> Any:
    """`run()` bounded by `timeout_s` (agrpo/timeouts.py): a hung tool leaves only its thread behind."""
    return call_within(
        run,
        timeout_s,
        f"agrpo-tool-{name}",
        lambda: ToolTimeout(f"tool {name} did not return within {timeout_s:g} s (agent.tool_timeout_s)"),
    )


def checked_result(name: str, result: Any) -> Any:
    """`result` if a tool message can carry it (a str, or JSON-serialisable data); else a TypeError for the model."""
    if isinstance(result, str):
        return result
    try:
        json.dumps(result)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"tool {name} returned a {type(result).__name__}, which a tool message cannot carry ({error}): return "
            "a str, a number, or a list/dict of them"
        ) from None
    return result


def capped(result: Any, max_chars: int | None) -> Any:
    """`result` as the tool message will carry it (TRL sends `str(result)`), cut at `max_chars` with a marker saying
    how much was cut; unchanged when it fits (pure)."""
    if max_chars is None:
        return result
    text = result if isinstance(result, str) else str(result)
    if len(text) <= max_chars:
        return result
    return text[:max_chars] + cut_marker(len(text) - max_chars, max_chars)


def cut_marker(cut: int, max_chars: int) -> str:
    """What follows the kept characters of a cut answer (pure); the prompt budget counts it too."""
    return f"\n[... {cut} more {CUT_MARK}{max_chars})]"


def call_guarded(
    name: str,
    func: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    timeout_s: float | None,
    max_chars: int | None = None,
):
    """Call a tool (sync or async) under the timeout, check its result and cap its length."""
    if inspect.iscoroutinefunction(func):

        def run() -> Any:
            return asyncio.run(func(*args, **kwargs))  # the rollout loop's tool thread: no event loop
    else:

        def run() -> Any:
            return func(*args, **kwargs)

    result = run() if timeout_s is None else run_with_timeout(run, timeout_s, name)
    return capped(checked_result(name, result), max_chars)


def _method_for(func: Callable[..., Any], name: str, bound: dict[str, Any], timeout_s: float | None, cap: int | None):
    """A function meant to be bound to a GuardedTool: it calls `func` guarded and shows `func`'s own signature
    (minus the bound options) and docstring, with its type hints resolved now (its globals are not `func`'s)."""
    signature = inspect.signature(func)
    hints = typing.get_type_hints(func)

    def method(self, *args: Any, **kwargs: Any) -> Any:
        return call_guarded(name, func, args, {**bound, **kwargs}, timeout_s, cap)

    receiver = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in signature.parameters.values() if p.name not in bound]
    method.__name__ = method.__qualname__ = name
    method.__doc__ = served_doc(func.__doc__)
    method.__module__ = func.__module__
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[receiver, *params], return_annotation=inspect.Signature.empty
    )
    method.__annotations__ = served_annotations({k: v for k, v in hints.items() if k not in bound})
    return method


class GuardedTarget:
    """A user's `_target_` with its options and the guard's limits; it pickles as those four, so TRL's rollout
    process loads the target again (a tool here, an environment factory in environments.py)."""

    def __init__(
        self,
        target: str,
        options: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_output_chars: int | None = None,
    ):
        self.target, self.options, self.timeout_s = target, dict(options or {}), timeout_s
        self.max_output_chars = max_output_chars

    def __reduce__(self):
        return (type(self), (self.target, self.options, self.timeout_s, self.max_output_chars))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target})"


class GuardedTool(GuardedTarget):
    """One `agent.tools` entry. Pass `.method` to TRL: a bound method named after the function, picklable (it
    pickles this object, which pickles as its target and options) and guarded by `call_guarded`."""

    def __init__(
        self,
        target: str,
        options: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        max_output_chars: int | None = None,
    ):
        super().__init__(target, options, timeout_s, max_output_chars)
        func = load_target(target)
        if not callable(func) or inspect.isclass(func):
            raise TypeError(f"{target} is a {type(func).__name__}, not a function")
        name = getattr(func, "__name__", "")
        if not name.isidentifier() or name.startswith("_"):
            raise TypeError(f"{target} is named {name!r}; a tool needs a public function name (the model calls it)")
        unknown = sorted(set(self.options) - set(inspect.signature(func).parameters))
        if unknown:
            raise TypeError(f"{target} takes no option {unknown}")
        self.name = name
        self.func = func
        self.method = MethodType(_method_for(func, name, self.options, timeout_s, max_output_chars), self)

    def __getattr__(self, item: str) -> Any:
        # pickle sends a bound method as getattr(<this object>, <its name>): answer that lookup with `.method`.
        if item != "name" and item == self.__dict__.get("name"):
            return self.__dict__["method"]
        raise AttributeError(item)


def build_tools(entries: list[Any], timeout_s: float | None, max_chars: int | None = None) -> list[GuardedTool]:
    """`agent.tools` as GuardedTools (raises ConfigError naming the entry that does not load)."""
    tools = []
    for index, entry in enumerate(entries):
        key = f"agent.tools[{index}]"
        target, options = split_entry(entry, key)
        try:
            tools.append(GuardedTool(target, options, timeout_s, max_chars))
        except Exception as error:  # any failure to load is the user's to fix; say which
            raise ConfigError(f"{key}={target!r} cannot be loaded as a tool: {error}") from None
    return tools


def guarded_method(
    function: Callable[..., Any], timeout_s: float | None, max_chars: int | None = None
) -> Callable[..., Any]:
    """An environment's tool method, guarded like a tool (same name, signature and docstring via __wrapped__)."""

    @functools.wraps(function)
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return call_guarded(function.__name__, functools.partial(function, self), args, kwargs, timeout_s, max_chars)

    method.__doc__ = served_doc(function.__doc__)
    method.__annotations__ = served_annotations(function.__annotations__)
    return method
