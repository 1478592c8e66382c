"""compose -> validate -> resolve: the one way a run config becomes the typed run spec every part of agrpo reads.

Every entrypoint goes through `prepare`: `python -m agrpo` (agrpo/cli.py, after Hydra composed), `agrpo eval`
(agrpo/eval/cli.py), launchers/serve_replica.py and the trainer Job (agrpo/launchers/hf_jobs/trainer.py). So a bad
override gets the same one-paragraph ConfigError (exit 2) everywhere, and downstream code reads the spec's final,
frozen values (device, dtype, served LoRA rank and count, proxy or not, queue size, eval's max tokens) instead of
deriving them (agrpo/config/spec.py). The trainer process reads the run's `config.yaml`, which holds this spec, with
`load_spec`; `agrpo plot` and `agrpo push` read it as plain data (a finished run, maybe of another agrpo version).
"""

from __future__ import annotations

from omegaconf import DictConfig

from agrpo.config.compose import compose_overrides  # noqa: F401  (entrypoints import it from here)
from agrpo.config.schema import RunConfig


def jobs_elsewhere(cfg: DictConfig, jobs_on_this_machine: bool) -> bool:
    """Whether the run's replicas and trainer are HF Jobs on the Hub's machines, not this one."""
    return cfg.launcher.name == "hf_jobs" and cfg.role == "all" and not jobs_on_this_machine


def machine_has_cuda(cfg: DictConfig, jobs_on_this_machine: bool = False) -> bool:
    """Whether the run's replicas and trainer have CUDA: HF Jobs always do (unless the Hub backend runs the Jobs on
    this machine); otherwise this machine decides. The one machine fact `resolve` needs."""
    if jobs_elsewhere(cfg, jobs_on_this_machine):
        return True
    import torch

    return torch.cuda.is_available()


def machine_has_bf16(cfg: DictConfig, jobs_on_this_machine: bool = False) -> bool:
    """Whether the run's GPUs compute in bfloat16: the Jobs' flavors decide for HF Jobs, else this machine's GPU.
    Without it (pre-Ampere) the defaults fall back, once, with a line saying so (agrpo/config/gpu_precision.py)."""
    from agrpo.config.gpu_precision import flavor_has_bf16, local_facts

    if jobs_elsewhere(cfg, jobs_on_this_machine):
        jobs = cfg.launcher.hf_jobs
        return flavor_has_bf16(jobs.trainer_flavor) and flavor_has_bf16(jobs.replica_flavor)
    facts = local_facts()
    if facts.cuda and not facts.bf16 and (cfg.trainer.bf16 is None or str(cfg.inference.dtype) == "auto"):
        import logging

        logging.getLogger("agrpo").warning(
            "%s (compute capability %s) has no bfloat16: the trainer trains in float32 and vLLM serves float16 "
            "(set trainer.bf16 / inference.dtype to choose)",
            facts.name,
            ".".join(map(str, facts.capability or ())),
        )
    return facts.bf16 or not facts.cuda


def prepare(
    cfg: DictConfig,
    check_environment: bool = True,
    evaluating: bool = False,
    cuda_available: bool | None = None,
    jobs_on_this_machine: bool = False,
) -> RunConfig:
    """Check the installed TRL wherever a run launches from (TrlChanged, exit 2, before anything else: a Jobs launch
    too, before any Job is submitted; the trainer Job checks its own TRL again), validate the composed `cfg` (one
    ConfigError listing every problem) and return its typed run spec, resolved and frozen. Writes nothing (the warm
    start's spec travels in the spec, `model.builder_input`, and its builder writes it).
    `check_environment=False` skips the checks against this machine (a replica node needs no data, rewards or trainer
    packages); `evaluating`: `agrpo eval`, which opens its test problems itself instead of the training data, adds
    its own checks and serves eval.adapter (inference.max_lora_rank then holds its rank too: eval_checks.py);
    `jobs_on_this_machine`: launcher=hf_jobs's Hub backend runs the Jobs here (agrpo/launchers/hf_jobs/hub.py), so
    this machine's device decides what they serve on."""
    from agrpo.config.eval_checks import served_adapter_rank
    from agrpo.config.resolve import resolve
    from agrpo.config.shared_fleet_checks import attached_spec
    from agrpo.config.validate import validate

    if check_environment and not evaluating:  # not a replica node or `agrpo eval`: no trainer, TRL may be absent
        from agrpo.trl_compat import check_trl

        check_trl()  # TRL's private names agrpo relies on (agrpo/trl_compat.py): reads TRL's source, imports nothing
    validate(
        cfg,
        check_environment=check_environment,
        evaluating=evaluating,
        jobs_on_this_machine=jobs_on_this_machine,
    )
    if check_environment:
        from agrpo.agents.warmstart import plan_warmstart

        cfg = plan_warmstart(cfg)  # agent.warmstart: the model becomes the warm-started folder (built before the start)
    cuda = machine_has_cuda(cfg, jobs_on_this_machine) if cuda_available is None else cuda_available
    bf16 = machine_has_bf16(cfg, jobs_on_this_machine) if cuda else True
    rank = served_adapter_rank(cfg) if evaluating and check_environment else None
    spec = resolve(cfg, cuda_available=cuda, bf16_supported=bf16, adapter_rank=rank)
    return attached_spec(spec)  # a run on a shared fleet talks to its proxy (agrpo/config/shared_fleet_checks.py)


def prepare_overrides(overrides: list[str], output_dir: str | None = None, check_environment: bool = True) -> RunConfig:
    """compose -> validate -> resolve in one call."""
    return prepare(compose_overrides(overrides, output_dir), check_environment=check_environment)
