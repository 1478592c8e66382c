"""Checks of single values and names against the schema: unknown keys, numeric ranges, names of real options.

Pure: reads the config (and the shipped config tree for option names), imports no user code.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from agrpo.config.schema import LogLevel, RunConfig, SyncMode, choice_fields
from agrpo.config.schema.inference import fleet_bounds
from agrpo.config.schema.trainer import is_auto

# (key, test, requirement): a value failing `test` gives "<key>=<value> must be <requirement>". None means "unset"
# and passes (the schema's Optional fields derive a value).
RANGES: list[tuple[str, Callable[[Any], bool], str]] = [
    ("trainer.learning_rate", lambda v: v > 0, "> 0"),
    ("trainer.per_device_train_batch_size", lambda v: v >= 1, ">= 1"),
    ("trainer.gradient_accumulation_steps", lambda v: v >= 1, ">= 1"),
    ("trainer.max_completion_length", lambda v: v >= 1, ">= 1"),
    ("trainer.temperature", lambda v: v > 0, "> 0 (GRPO needs varied samples)"),
    ("trainer.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("trainer.epsilon", lambda v: v > 0, "> 0"),
    ("trainer.epsilon_high", lambda v: v > 0, "> 0 (or null: epsilon)"),
    ("trainer.logging_steps", lambda v: v >= 1, ">= 1"),
    ("trainer.save_steps", lambda v: v >= 0, ">= 0 (0 disables checkpoints)"),
    ("trainer.save_total_limit", lambda v: v >= 1, ">= 1 (or null: keep all)"),
    ("trainer.max_inflight_tasks", lambda v: is_auto(v) or (str(v).isdigit() and int(v) >= 1), ">= 1 or auto"),
    ("sync.mode", lambda v: SyncMode.parse(v) is not None, f"one of {' | '.join(SyncMode.values())}"),
    ("trainer.queue_maxsize", lambda v: v == -1 or v >= 1, ">= 1 (or -1: derived)"),
    ("trainer.cpu_threads", lambda v: v >= 1, ">= 1 (or null: derived)"),
    ("lora.r", lambda v: v >= 1, ">= 1"),
    ("lora.alpha", lambda v: v > 0, "> 0"),
    ("lora.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("data.max_prompts", lambda v: v >= 1, ">= 1 (or null: all)"),
    ("inference.max_model_len", lambda v: v >= 1, ">= 1"),
    ("inference.max_lora_rank", lambda v: v >= 1, ">= 1 (or null: derived)"),
    ("inference.max_loras", lambda v: v >= 1, ">= 1 (or null: derived)"),
    ("inference.gpu_memory_utilization", lambda v: 0 < v <= 1, "in (0, 1] (or null: derived)"),
    ("inference.gpus_per_replica", lambda v: v >= 1, ">= 1"),
    ("inference.cpu_kvcache_gib", lambda v: v >= 1, ">= 1"),
    ("inference.cpu_cores_per_replica", lambda v: v >= 0, ">= 0"),
    ("inference.base_port", lambda v: 0 < v < 65536, "a TCP port (1-65535)"),
    ("inference.startup_timeout_s", lambda v: v > 0, "> 0"),
    ("sync.poll_interval_s", lambda v: v > 0, "> 0"),
    ("launcher.stop_timeout_s", lambda v: v >= 0, ">= 0"),
    ("launcher.accelerate.num_processes", lambda v: v >= 1, ">= 1 (or null: derived)"),
    ("launcher.accelerate.main_process_port", lambda v: 0 < v < 65536, "a TCP port (1-65535)"),
    ("logger.bottleneck_every_steps", lambda v: v >= 0, ">= 0 (0 disables it)"),
    ("eval.k", lambda v: v >= 1, ">= 1"),
    ("eval.temperature", lambda v: v >= 0, ">= 0"),
    ("eval.top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("eval.max_problems", lambda v: v >= 1, ">= 1 (or null: all)"),
    ("eval.max_tokens", lambda v: v >= 1, ">= 1 (or null: trainer.max_completion_length)"),
    ("eval.concurrency", lambda v: v >= 1, ">= 1"),
]

LOG_LEVELS = LogLevel.values()
# Choice fields whose check (and its own words) is elsewhere in the validation pass; `choice_problems` checks the rest.
CHECKED_ELSEWHERE = {
    "sync.mode": "RANGES above",
    "logger.level": "range_problems",
    "trainer.attention": "machine_checks.setting_problems",
    "inference.device": "validate.cross_field_problems",
    "role": "validate.cross_field_problems",
    "inference.dtype": "vllm_checks.vllm_problems",
    "launcher.hf_jobs.trainer_launcher": "hf_jobs_checks.hf_jobs_problems",
}

# logger.report_to names (transformers' integrations) -> (module to import, pip requirement).
INTEGRATIONS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
    "mlflow": ("mlflow", "mlflow"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
    "neptune": ("neptune", "neptune"),
    "aim": ("aim", "aim"),
    "codecarbon": ("codecarbon", "codecarbon"),
}
NO_INTEGRATION = ("none",)


def range_problems(cfg: DictConfig) -> list[str]:
    problems = []
    for key, test, requirement in RANGES:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and not test(value):
            problems.append(f"{key}={value} must be {requirement}")
    if LogLevel.parse(cfg.logger.level) is None:
        problems.append(f"logger.level={cfg.logger.level!r} must be one of {list(LOG_LEVELS)}")
    return problems + choice_problems(cfg)


def choice_problems(cfg: DictConfig) -> list[str]:
    """Each choice field (an Enum in the schema) not checked elsewhere names one of its choices. Hydra composes
    choice fields as text (agrpo/config/schema/knobs.py: `composable`), so a bad name arrives here."""
    problems = []
    for key, choices in choice_fields(RunConfig).items():
        value = OmegaConf.select(cfg, key, default=None)
        if key not in CHECKED_ELSEWHERE and value is not None and choices.parse(value) is None:
            problems.append(f"{key}={value!r} must be one of {' | '.join(choices.values())}")
    return problems


def unknown_key_problems(node: Any, prefix: str = "") -> list[str]:
    """Keys that no schema dataclass declares. Hydra's struct mode refuses `key=value` for them, but a `+key=value`
    override (the fix Hydra's own error suggests) adds them anyway, and they would be silently ignored."""
    problems: list[str] = []
    schema = OmegaConf.get_type(node)
    if not (isinstance(node, DictConfig) and dataclasses.is_dataclass(schema)):
        return problems
    known = [f.name for f in dataclasses.fields(schema)]
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in known:
            where_else = " (other AsyncGRPOConfig fields go under trainer.extra)" if prefix == "trainer." else ""
            problems.append(f"{path} is not a config key{did_you_mean(str(key), known, prefix)}: remove it{where_else}")
        else:
            problems += unknown_key_problems(node._get_node(key), f"{path}.")
    return problems


def did_you_mean(name: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, options, n=3, cutoff=0.75)
    return f" (did you mean {', '.join(prefix + c for c in close)}?)" if close else ""


def group_options(group: str) -> list[str]:
    """The options of a shipped config group (conf/<group>/*.yaml), i.e. what `group=NAME` accepts."""
    from agrpo.paths import CONF_DIR

    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def name_problems(cfg: DictConfig) -> list[str]:
    """launcher.name, sync.kind and logger.report_to must name something that exists."""
    import importlib.util

    problems = []
    launchers = group_options("launcher")
    name = cfg.launcher.name
    if name not in launchers and not module_exists(f"agrpo.launchers.{name}"):
        problems.append(f"launcher.name={name!r} is not a launcher: pick launcher={' | launcher='.join(launchers)}")
    if importlib.util.find_spec(f"agrpo.sync.{cfg.sync.kind}") is None:
        problems.append(
            f"sync.kind={cfg.sync.kind!r} has no module agrpo/sync/{cfg.sync.kind}.py: pick "
            f"sync={' | sync='.join(group_options('sync'))}"
        )
    elif not registers_store(cfg.sync.kind):
        problems.append(
            f"sync.kind={cfg.sync.kind!r}: agrpo/sync/{cfg.sync.kind}.py registers no adapter store (a helper "
            f"module, not a kind): pick sync={' | sync='.join(group_options('sync'))}"
        )
    for entry in cfg.logger.report_to or []:
        if entry not in INTEGRATIONS and entry not in NO_INTEGRATION:
            problems.append(
                f"logger.report_to has {entry!r}, which is not an integration: use some of "
                f"{sorted(INTEGRATIONS)} (or [] for none)"
            )
    return problems


def registers_store(kind: str) -> bool:
    """Whether agrpo/sync/<kind>.py registers an adapter store under `kind` (what the trainer's get_store needs).
    Imported by name, as the trainer will: the stores are plugins (agrpo/plugins.py)."""
    import importlib

    importlib.import_module(f"agrpo.sync.{kind}")
    return kind in importlib.import_module("agrpo.sync.base").STORES


def module_exists(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def most_replicas(inference: Any) -> int:
    """The most replicas behind the proxy (1 for a replicas value validation refuses anyway)."""
    try:
        return max(1, fleet_bounds(inference)[1])
    except (TypeError, ValueError):
        return 1


def proxy_problems(cfg: DictConfig) -> list[str]:
    """The proxy's own checks (ProxySettings.problems), with its CLI flags translated to `proxy.*` keys. The
    launcher fills `upstreams` with the replicas' URLs; stand-ins of the same count are checked here."""
    from agrpo.proxy.settings import ProxySettings

    values = OmegaConf.to_container(cfg.proxy, resolve=True)
    if not values.get("upstreams"):
        count = len(cfg.inference.urls) or most_replicas(cfg.inference)
        values["upstreams"] = [f"http://127.0.0.1:{9000 + i}" for i in range(count)]
    found = ProxySettings(**values).problems()

    def as_key(match: re.Match) -> str:
        flag = match.group(1)
        return "proxy.upstreams" if flag == "upstream" else "proxy." + flag.replace("-", "_")

    return [re.sub(r"--([a-z][a-z-]*)", as_key, problem) for problem in found]
