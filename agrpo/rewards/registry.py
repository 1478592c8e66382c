"""Turn the `reward.funcs` config into picklable, weighted reward callables for TRL."""

from __future__ import annotations

import functools
from typing import Any

from hydra.utils import get_method
from omegaconf import OmegaConf

from agrpo.errors import ConfigError
from agrpo.rewards.base import WeightedReward


def _default_name(target: str, kwargs: dict[str, Any]) -> str:
    """The callable's name; a wrapper of another reward (`reward: dotted.path`) is named after what it wraps."""
    name = target.rsplit(".", 1)[-1]
    wrapped = kwargs.get("reward")
    return f"{name}[{wrapped.rsplit('.', 1)[-1]}]" if isinstance(wrapped, str) else name


def build_reward_funcs(funcs_cfg: Any) -> list[WeightedReward]:
    """Each term `{_target_: dotted.path, weight: w, name: optional, **kwargs}` becomes
    WeightedReward(partial(target, **kwargs), w), named uniquely (TRL logs `rewards/<name>`)."""
    terms = OmegaConf.to_container(funcs_cfg, resolve=True) if OmegaConf.is_config(funcs_cfg) else funcs_cfg
    rewards = []
    for index, term in enumerate(terms or []):
        if not isinstance(term, dict) or "_target_" not in term:
            raise ConfigError(f"reward.funcs[{index}] must be a mapping with `_target_` (a dotted callable), got {term!r}")
        term = dict(term)
        target = term.pop("_target_")
        weight = term.pop("weight", 1.0)
        name = term.pop("name", None)
        try:
            func = get_method(target)
        except Exception as error:
            raise ConfigError(f"reward.funcs[{index}]._target_={target!r} cannot be imported: {error}") from None
        if term:
            bound = functools.partial(func, **term)
            functools.update_wrapper(bound, func)
            func = bound
        rewards.append(WeightedReward(func, weight, name=name or _default_name(target, term)))
    taken: dict[str, int] = {}
    for reward in rewards:  # TRL logs each term under its name: two terms must not share one
        taken[reward.__name__] = taken.get(reward.__name__, 0) + 1
        if taken[reward.__name__] > 1:
            reward.__name__ = f"{reward.__name__}_{taken[reward.__name__]}"
    if not rewards:
        raise ConfigError("reward.funcs is empty: choose a reward group (e.g. reward=smoke) or add a term")
    return rewards
