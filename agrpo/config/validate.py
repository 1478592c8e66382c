"""The one validation pass, run before any process, Job or file outside the run dir exists (dry run included).

`find_problems` holds the checks of the config alone (pure): unknown keys, ranges, names, cross-field rules.
`validate` adds the checks against this machine (agrpo/config/environment.py: imports, files, packages, device) and
raises one ConfigError listing everything, each problem naming the key to change.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agrpo.config.ranges import name_problems, proxy_problems, range_problems, unknown_key_problems
from agrpo.config.data_checks import opened_data_problems
from agrpo.config.fleet_checks import fleet_problems
from agrpo.config.hf_jobs_checks import hf_jobs_problems
from agrpo.config.machine_checks import machine_problems, setting_problems
from agrpo.config.resolve import least_loras
from agrpo.config.schema import Device, Role
from agrpo.config.shared_fleet_checks import shared_fleet_problems
from agrpo.config.launch_checks import accelerate_problems, run_dir_problems
from agrpo.config.vllm_checks import vllm_problems
from agrpo.errors import ConfigError

NOT_IN_ADAPTER = ("lm_head", "embed_tokens", "wte", "embed_out")
ROLES = Role.values()
DEVICES = Device.values()


def find_problems(cfg: DictConfig) -> list[str]:
    """Everything wrong with the config itself, without looking at this machine."""
    problems = unknown_key_problems(cfg)
    if problems:  # other checks would read the stray keys' siblings with wrong assumptions: fix these first
        return problems
    return value_problems(cfg)


def value_problems(cfg: DictConfig, jobs_on_this_machine: bool = False) -> list[str]:
    """The config's own checks, once every key is one the schema declares (`jobs_on_this_machine`: the Hub backend
    runs launcher=hf_jobs's Jobs here, agrpo/launchers/hf_jobs/hub.py)."""
    return (
        range_problems(cfg)
        + name_problems(cfg)
        + cross_field_problems(cfg, jobs_on_this_machine)
        + proxy_problems(cfg)
        + gpu_path(cfg)
    )


def gpu_path(cfg: DictConfig) -> list[str]:
    """vLLM's start-up constraints (vllm_checks.py), the trainer.attention value (machine_checks.py) and
    launcher.accelerate's rules (launch_checks.py)."""
    return vllm_problems(cfg) + setting_problems(cfg) + accelerate_problems(cfg)


def cross_field_problems(cfg: DictConfig, jobs_on_this_machine: bool = False) -> list[str]:
    """Rules between fields: the adapter against what vLLM serves, the trainer's limits, the run's shape, rewards."""
    return (
        adapter_problems(cfg)
        + trainer_limit_problems(cfg)
        + run_shape_problems(cfg)
        + trainer_extra_problems(cfg)
        + hf_jobs_problems(cfg, jobs_on_this_machine=jobs_on_this_machine)
        + reward_term_problems(cfg)
    )


def adapter_problems(cfg: DictConfig) -> list[str]:
    """The LoRA adapter is one vLLM can serve, in the slots and rank the replicas have."""
    problems: list[str] = []
    trainer, inference, lora = cfg.trainer, cfg.inference, cfg.lora
    needed_loras = least_loras(trainer)
    if inference.max_loras is not None and inference.max_loras < needed_loras:
        problems.append(
            f"inference.max_loras={inference.max_loras} is below trainer.max_staleness + 2 = {needed_loras} (every "
            "policy version a rollout may still name, plus the one being loaded): raise inference.max_loras or "
            "lower trainer.max_staleness (or leave inference.max_loras unset to derive it)"
        )
    if inference.max_lora_rank is not None and lora.r > inference.max_lora_rank:
        problems.append(
            f"lora.r={lora.r} exceeds inference.max_lora_rank={inference.max_lora_rank}: lower lora.r "
            "or raise inference.max_lora_rank (or leave it unset to derive it)"
        )
    if lora.r > 512:
        problems.append(f"lora.r={lora.r} exceeds the largest rank vLLM serves (512)")
    if lora.use_dora:
        problems.append(
            "lora.use_dora=true cannot be synced adapter-only (vLLM serves plain LoRA): set lora.use_dora=false"
        )
    if lora.modules_to_save:
        problems.append(
            f"lora.modules_to_save={list(lora.modules_to_save)} trains full modules that a LoRA adapter "
            "cannot carry to vLLM: set lora.modules_to_save=null"
        )
    in_head = [m for m in lora.target_modules if any(part in m for part in NOT_IN_ADAPTER)]
    if in_head:
        problems.append(
            f"lora.target_modules targets {in_head}: TRL computes log-probs from the base head and vLLM "
            "does not serve embedding LoRA; remove them"
        )
    return problems


def trainer_limit_problems(cfg: DictConfig) -> list[str]:
    """The trainer's lengths and counts."""
    problems: list[str] = []
    trainer, inference = cfg.trainer, cfg.inference
    if trainer.max_completion_length >= inference.max_model_len:
        problems.append(
            f"trainer.max_completion_length={trainer.max_completion_length} leaves no room for the prompt "
            f"in inference.max_model_len={inference.max_model_len}: raise the latter or lower the former"
        )
    if trainer.max_staleness < 0:
        problems.append("trainer.max_staleness must be >= 0")
    if trainer.weight_sync_steps < 1:
        problems.append("trainer.weight_sync_steps must be >= 1")
    if trainer.num_generations < 2:
        problems.append("trainer.num_generations must be >= 2 (GRPO compares completions within a group)")
    if trainer.max_steps < 1:
        problems.append("trainer.max_steps must be >= 1")
    return problems


def run_shape_problems(cfg: DictConfig) -> list[str]:
    """Replicas, device and role: what the launcher can start."""
    problems: list[str] = []
    inference = cfg.inference
    problems += fleet_problems(cfg) + shared_fleet_problems(cfg)
    if inference.device not in DEVICES:
        problems.append(f"inference.device={inference.device!r} must be one of {DEVICES}")
    if cfg.role not in ROLES:
        problems.append(f"role={cfg.role!r} must be one of {ROLES}")
    if cfg.role == "trainer" and not inference.urls:
        problems.append("role=trainer needs the replicas' URLs in inference.urls")
    return problems


def trainer_extra_problems(cfg: DictConfig) -> list[str]:
    """`trainer.extra` names no field trainer.* already has."""
    shadowed = sorted(set(cfg.trainer.extra or {}) & set(cfg.trainer.keys()))
    if not shadowed:
        return []
    return [
        f"trainer.extra sets {shadowed}, which trainer.* already has: set trainer.{shadowed[0]} "
        "instead (trainer.extra is for the AsyncGRPOConfig fields agrpo does not name)"
    ]


def reward_term_problems(cfg: DictConfig) -> list[str]:
    """Some reward exists, and every term names its callable."""
    problems: list[str] = []
    funcs = cfg.reward.funcs or []
    if not funcs and cfg.agent.environment is None:  # an environment may own the reward (agrpo/agents/checks.py)
        problems.append("reward.funcs is empty: choose a reward group (e.g. reward=smoke) or add a term")
    for index, term in enumerate(funcs):
        if not hasattr(term, "get") or not term.get("_target_"):
            problems.append(f"reward.funcs[{index}] needs a `_target_` (dotted path of a reward callable)")
    return problems


def resolution_problems(cfg: DictConfig) -> list[str]:
    """Every interpolation resolves (`${oc.env:...}`, `${data_dir}`, resolvers); the first failure, as a sentence."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "the config"
        message = str(getattr(error, "msg", None) or error).splitlines()[0]
        return [f"{key} cannot be resolved: {message}"]
    return []


def validate(
    cfg: DictConfig, check_environment: bool = True, evaluating: bool = False, jobs_on_this_machine: bool = False
) -> None:
    """Raise one ConfigError listing every problem, so the user fixes them in one go. `check_environment=False`
    skips the checks against this machine (imports, files, packages, device); `evaluating`: `agrpo eval`, which
    reads its own test problems instead of the training data and adds its own checks (eval_checks.py);
    `jobs_on_this_machine`: the Hub backend runs launcher=hf_jobs's Jobs here (their replicas serve on this machine,
    whatever the flavor)."""
    from agrpo.agents.checks import agent_problems
    from agrpo.config.environment import environment_problems
    from agrpo.config.eval_checks import eval_problems

    problems = resolution_problems(cfg)  # the other checks read resolved values
    if not problems:
        problems = unknown_key_problems(cfg)  # stray keys first: the rest assumes the schema's shape
    if not problems:
        problems = value_problems(cfg, jobs_on_this_machine)
        if check_environment:
            problems += environment_problems(cfg, not evaluating) + machine_problems(cfg) + run_dir_problems(cfg)
        problems += agent_problems(cfg, check_environment)  # tools and environments (agrpo/agents/checks.py)
        problems += eval_problems(cfg, check_environment) if evaluating else []
    if not problems and check_environment and not evaluating:
        problems = opened_data_problems(cfg)  # the data opened: columns, reward options, rows through the template
    if problems:
        listing = "; ".join(problems)
        raise ConfigError(f"invalid config ({len(problems)} problem{'s' if len(problems) > 1 else ''}): {listing}.")
