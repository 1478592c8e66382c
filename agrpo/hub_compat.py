"""huggingface_hub 1.x and 2.x side by side: agrpo sends an argument only where the installed line takes it.

A GPU set-up holds huggingface_hub below 2 (vLLM 0.31 needs transformers < 5.18, which needs huggingface_hub < 2), a
CPU set-up gets 2.x, and the trainer Job runs in vLLM's image (1.x). Every HfApi call agrpo makes uses arguments both
lines share, except the few listed in HUB_2_ONLY: those go through `supported_kwargs`, which drops them when they are
unset and refuses them, naming the upgrade, when they are set. tests/test_hub_compat.py checks every HfApi call in
agrpo's source against the installed signatures, so the suite run under constraints/gpu-versions.txt catches a new one.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from agrpo.errors import LaunchError

# (HfApi method, argument) -> (config key that sets it, what it does): arguments only huggingface_hub 2.x has.
HUB_2_ONLY = {
    ("run_job", "attempts"): ("launcher.hf_jobs.trainer_attempts", "the platform's requeue of a failed trainer Job"),
}
WHY_HUB_1 = (
    "a GPU set-up (vLLM 0.31 -> transformers < 5.18) holds huggingface_hub below 2: launch from an environment "
    "with huggingface_hub >= 2 (a CPU set-up, `make setup`, or `pip install 'huggingface_hub>=2'` where "
    "transformers >= 5.18 is allowed)"
)


class HubTooOld(LaunchError):
    """An argument agrpo was asked to send exists only in a newer huggingface_hub."""


def hub_version() -> str:
    import huggingface_hub

    return huggingface_hub.__version__


def accepts(method: Callable[..., Any], name: str) -> bool:
    """Whether `method` takes a keyword argument `name` (a method taking **kwargs takes any: a stand-in)."""
    parameters = inspect.signature(method).parameters
    if name in parameters:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def hub_api_accepts(method_name: str, name: str) -> bool:
    """Whether the installed huggingface_hub's `HfApi.<method_name>` takes `name`."""
    from huggingface_hub import HfApi

    return accepts(getattr(HfApi, method_name), name)


def too_old_message(method_name: str, name: str, value: Any) -> str:
    key, what = HUB_2_ONLY.get((method_name, name), (name, f"HfApi.{method_name}'s {name}="))
    return (
        f"{key}={value} needs {what}, which huggingface_hub {hub_version()} does not have (HfApi.{method_name} "
        f"takes `{name}=` from huggingface_hub 2.0 on): set {key} to its default, or {WHY_HUB_1}"
    )


def supported_kwargs(method: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` for `method`, less the arguments it does not take that are unset (None). A set one it does not take
    raises HubTooOld naming the config key and the upgrade, before anything is sent."""
    sent = {}
    for name, value in kwargs.items():
        if accepts(method, name):
            sent[name] = value
        elif value is not None:
            raise HubTooOld(too_old_message(getattr(method, "__name__", str(method)), name, value))
    return sent


def config_problems(cfg: Any) -> list[str]:
    """The config asks for something the installed huggingface_hub cannot send. Checked where the Jobs are launched
    (role=all, whichever Hub backend: a stand-in is called through the same HfApi), not inside the trainer Job."""
    if cfg.launcher.name != "hf_jobs" or cfg.role != "all":
        return []
    attempts = cfg.launcher.hf_jobs.trainer_attempts
    if attempts > 1 and not hub_api_accepts("run_job", "attempts"):
        return [too_old_message("run_job", "attempts", attempts)]
    return []
