"""launcher=accelerate: launcher=local's plan, with the trainer started by `accelerate launch` under FSDP2.

Replicas keep their GPUs and the proxy sits in front of several, exactly as planned by agrpo/launchers/local.py
(with inference.replicas=auto, the spare replicas and local's fleet controller too); only the trainer process changes: `python -m accelerate.commands.launch` (what the `accelerate launch` console
script runs, pinned to this interpreter) with one rank per trainer GPU and a config file generated from
launcher.accelerate (agrpo/launchers/fsdp.py), written to <run_dir>/accelerate_fsdp.yaml before anything starts.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from textwrap import indent
from pathlib import Path
from typing import Any

import yaml

from agrpo.config.schema import AccelerateConfig, ModelConfig, RunConfig
from agrpo.errors import ConfigError
from agrpo.launchers.base import Launcher, register
from agrpo.launchers.fsdp import ACCELERATE_CONFIG_FILE, build_fsdp_config, layer_cls_from_model_config
from agrpo.launchers.local import LocalLauncher
from agrpo.launchers.plan import Placeholders, Plan, PortGroup, ProcessSpec, port_placeholder

ACCELERATE_LAUNCH = ["-m", "accelerate.commands.launch"]
MAIN_PROCESS_PORT = "accelerate-main"  # the ranks' rendezvous port, by name (a placeholder until the plan runs)


def trainer_processes(knobs: AccelerateConfig, trainer_gpus: list[int] | None) -> int:
    """Ranks: one per trainer GPU unless launcher.accelerate.num_processes says otherwise (1 on a CPU machine). More
    ranks than the trainer's GPUs is this plan's check: the GPUs are what the plan assigned on this machine."""
    if knobs.num_processes is None:
        return len(trainer_gpus) if trainer_gpus else 1
    if trainer_gpus and knobs.num_processes > len(trainer_gpus):
        raise ConfigError(
            f"launcher.accelerate.num_processes={knobs.num_processes} is more than the trainer's {len(trainer_gpus)} "
            f"GPU(s) {trainer_gpus}: lower it, or give the trainer more GPUs with trainer.gpus / inference.gpus"
        )
    return knobs.num_processes


def build_accelerate_plan(
    cfg: RunConfig, local: Plan, layer_cls: str | None, python: str = sys.executable
) -> tuple[Plan, dict[str, Any]]:
    """Swap the local plan's trainer for an `accelerate launch` of the same trainer command (pure). The ranks'
    rendezvous port is one more placeholder, searched from launcher.accelerate.main_process_port when the plan runs.

    Returns the plan and the accelerate config file's content, which the executor writes into the run dir.
    """
    knobs = cfg.launcher.accelerate
    main_process_port = port_placeholder(MAIN_PROCESS_PORT)
    local_trainer = local.trainer
    on_cpu = local_trainer.gpus is None
    num_processes = trainer_processes(knobs, local_trainer.gpus)
    config_path = str(Path(local.run_dir) / ACCELERATE_CONFIG_FILE)
    accelerate_config = build_fsdp_config(knobs, num_processes, main_process_port, layer_cls, on_cpu)
    env = dict(local_trainer.env)
    if on_cpu:
        # The ranks join a gloo group (DDP, no FSDP: accelerate enables FSDP on accelerators only) and share the
        # cores the replicas leave.
        env["ACCELERATE_USE_CPU"] = "true"
        env["OMP_NUM_THREADS"] = str(max(int(env.get("OMP_NUM_THREADS", "1")) // num_processes, 1))
    argv = [
        python,
        *ACCELERATE_LAUNCH,
        "--config_file",
        config_path,
        "--num_processes",
        str(num_processes),
        "--main_process_port",
        main_process_port,
        *knobs.extra_args,
        *local_trainer.argv[1:],
    ]  # "-m agrpo.trainer <config> --vllm-url URL --num-replicas R", as launched locally
    trainer = ProcessSpec(name="trainer", role="trainer", argv=argv, env=env, gpus=local_trainer.gpus)
    notes = [
        *local.notes,
        gpu_assignment(local, num_processes),
        f"accelerate config {config_path}:\n"
        + indent(yaml.safe_dump(accelerate_config, sort_keys=False).rstrip(), "    "),
    ]
    if on_cpu:
        notes.append(
            "CPU machine: the trainer ranks run over gloo without FSDP sharding (docs/multi_gpu_and_sweeps.md)"
        )
    plan = dataclasses.replace(  # replicas, proxy and fleet (the same spares, same controller) as local planned them
        local,
        launcher="accelerate",
        trainer=trainer,
        notes=notes,
        files=dict(local.files),
        placeholders=Placeholders(
            [*local.placeholders.ports, rendezvous_port(knobs)], list(local.placeholders.secrets)
        ),
    )
    return plan, accelerate_config


def rendezvous_port(knobs: AccelerateConfig) -> PortGroup:
    """The ranks' rendezvous port, reserved with the run's others (on this machine's loopback, as before)."""
    return PortGroup([MAIN_PROCESS_PORT], int(knobs.main_process_port), key="launcher.accelerate.main_process_port")


def gpu_assignment(local: Plan, num_processes: int) -> str:
    """One line: which GPUs the trainer ranks and each replica use."""
    spares = local.fleet.spares if local.fleet else []
    replicas = [
        f"{spec.name}{' (on demand)' if spec in spares else ''} -> {spec.gpus if spec.gpus is not None else 'CPU'}"
        for spec in [*local.services, *spares]
        if spec.role == "replica"
    ]
    trainer = (
        f"trainer ranks 0..{num_processes - 1} -> GPUs {local.trainer.gpus}"
        if local.trainer.gpus
        else f"trainer ranks 0..{num_processes - 1} -> CPU"
    )
    return "GPU assignment: " + "; ".join([trainer, *replicas])


def local_layer_cls(model_cfg: ModelConfig) -> str | None:
    """The wrap class from the model's config.json when the model is a local folder that exists; else None."""
    config_file = Path(str(model_cfg.name_or_path)).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    return layer_cls_from_model_config(json.loads(config_file.read_text()))


@register
class AccelerateLauncher(Launcher):
    name = "accelerate"

    def __init__(self) -> None:
        self.local = LocalLauncher()

    def build_plan(self, cfg: RunConfig) -> Plan:
        local = self.local.build_plan(cfg)
        plan, accelerate_config = build_accelerate_plan(cfg, local, local_layer_cls(cfg.model))
        plan.files[ACCELERATE_CONFIG_FILE] = yaml.safe_dump(accelerate_config, sort_keys=False)
        return plan

    def execute(self, plan: Plan) -> dict[str, Any]:
        return self.local.execute(plan)  # the plan carries the accelerate config file
