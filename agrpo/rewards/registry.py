"""Turn the `reward.funcs` config into picklable, weighted reward callables for TRL.

`_target_` is a dotted path (`agrpo.rewards.generic.exact_match`, or `my_rewards.score` for a module in the working
directory) or a file path and a function name (`rewards/my_task.py:score`), so a user's own reward needs no package.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.utils import get_method
from omegaconf import OmegaConf

from agrpo.errors import ConfigError
from agrpo.rewards.base import WeightedReward


class FileFunction:
    """A function from a Python file, picklable by its path and name: TRL scores in a spawned child process, which
    reloads the file instead of importing a module by a name it cannot find."""

    def __init__(self, path: str | Path, name: str):
        self.path = str(Path(path).expanduser().resolve())
        self.name = name
        self._func: Any = None

    def load(self) -> Any:
        if self._func is None:
            module_name = "agrpo_user_reward_" + hashlib.sha256(self.path.encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(module_name, self.path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            func = getattr(module, self.name, None)
            if not callable(func):
                raise AttributeError(f"{self.path} defines no function {self.name!r}")
            self._func = func
        return self._func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __reduce__(self):
        return (FileFunction, (self.path, self.name))

    def __repr__(self) -> str:
        return f"FileFunction({self.path}:{self.name})"


def resolve_target(target: str) -> Any:
    """The callable a `_target_` names: `file.py:function`, or a dotted path (tried from the working directory too,
    which `python -m agrpo` has on sys.path but the `agrpo` console script does not)."""
    if ":" in target:
        path, _, name = target.rpartition(":")
        if not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"no file {path!r} (relative paths are from {Path.cwd()})")
        func = FileFunction(path, name)
        func.load()  # fail now, not in TRL's scoring child
        return func
    try:
        return get_method(target)
    except Exception:
        top = target.split(".", 1)[0]
        cwd = Path.cwd()
        if str(cwd) in sys.path or not ((cwd / f"{top}.py").is_file() or (cwd / top / "__init__.py").is_file()):
            raise
        sys.path.insert(0, str(cwd))  # spawned children inherit sys.path, so TRL's scorer finds it too
        return get_method(target)


def options_of(func: Any) -> set[str]:
    """The keyword options a reward function declares (TRL's own arguments excluded)."""
    target = func.load() if isinstance(func, FileFunction) else func
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return set()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters if p.kind in named} - {"completions", "prompts", "completion_ids"}


def unknown_options(func: Any, options: dict[str, Any]) -> list[str]:
    """Bound options the function does not declare: with a `**columns` catch-all a typo (`colum:`) would otherwise
    vanish silently into the dataset columns."""
    declared = options_of(func)
    if not declared or "reward" in declared:  # a wrapper (zero_if_truncated) forwards the rest to what it wraps
        return []
    return sorted(set(options) - declared)


def _default_name(target: str, kwargs: dict[str, Any]) -> str:
    """The callable's name; a wrapper of another reward (`reward: dotted.path`) is named after what it wraps."""
    name = target.rsplit(":", 1)[-1] if ":" in target else target.rsplit(".", 1)[-1]
    wrapped = kwargs.get("reward")
    return f"{name}[{wrapped.rsplit('.', 1)[-1]}]" if isinstance(wrapped, str) else name


def _terms(funcs_cfg: Any) -> list[Any]:
    return (OmegaConf.to_container(funcs_cfg, resolve=True) if OmegaConf.is_config(funcs_cfg) else funcs_cfg) or []


def unique_names(names: Sequence[str], separator: str = "_") -> list[str]:
    """TRL logs each term under its name (`rewards/<name>`): a repeated name gets _2, _3, ..."""
    taken: dict[str, int] = {}
    unique = []
    for name in names:
        taken[name] = taken.get(name, 0) + 1
        unique.append(name if taken[name] == 1 else f"{name}{separator}{taken[name]}")
    return unique


def term_weights(funcs_cfg: Any) -> dict[str, float]:
    """{name TRL logs the term under: its weight}, from the config alone (nothing imported)."""
    terms = [t for t in _terms(funcs_cfg) if isinstance(t, dict) and "_target_" in t]
    names = [
        t.get("name") or _default_name(t["_target_"], {k: v for k, v in t.items() if k != "_target_"}) for t in terms
    ]
    return dict(zip(unique_names(names), (float(t.get("weight", 1.0)) for t in terms)))


def build_reward_funcs(funcs_cfg: Any) -> list[WeightedReward]:
    """Each term `{_target_: dotted.path, weight: w, name: optional, **kwargs}` becomes
    WeightedReward(partial(target, **kwargs), w), named uniquely (TRL logs `rewards/<name>`)."""
    terms = _terms(funcs_cfg)
    rewards = []
    for index, term in enumerate(terms):
        if not isinstance(term, dict) or "_target_" not in term:
            raise ConfigError(
                f"reward.funcs[{index}] must be a mapping with `_target_` (a dotted callable), got {term!r}"
            )
        term = dict(term)
        target = term.pop("_target_")
        weight = term.pop("weight", 1.0)
        name = term.pop("name", None)
        try:
            func = resolve_target(target)
        except Exception as error:
            raise ConfigError(f"reward.funcs[{index}]._target_={target!r} cannot be imported: {error}") from None
        unknown = unknown_options(func, term)
        if unknown:
            raise ConfigError(
                f"reward.funcs[{index}] ({target}) takes no option {unknown}; its options are "
                f"{sorted(options_of(func))}"
            )
        if term:
            bound = functools.partial(func, **term)
            if inspect.isfunction(func):
                functools.update_wrapper(bound, func)
            func = bound
        rewards.append(WeightedReward(func, weight, name=name or _default_name(target, term)))
    for reward, name in zip(rewards, unique_names([r.__name__ for r in rewards])):
        reward.__name__ = name
    if not rewards:
        raise ConfigError("reward.funcs is empty: choose a reward group (e.g. reward=smoke) or add a term")
    return rewards
