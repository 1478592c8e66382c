"""How a run starts: launcher=local | accelerate | hf_jobs, and each one's own knobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agrpo.config.schema.choices import MixedPrecision, TrainerLauncher
from agrpo.config.schema.knobs import group, knob


@dataclass(frozen=True)
class HFJobsConfig:
    """launcher=hf_jobs: R vLLM replica Jobs plus one trainer Job on Hugging Face Jobs (docs/hf_jobs.md)."""

    namespace: Optional[str] = knob(
        None, doc="Where Jobs run and are billed; None: the token's own user (one whoami call)."
    )
    run_id: str = knob(
        "${run_name}-${now:%Y%m%d-%H%M%S}",
        doc="Labels every Job of the run (agrpo-run=<run_id>), so `agrpo jobs status|logs|cancel RUN_ID` finds them; "
        "the same id again resumes from <sync.mount_path>/<run_id> in the bucket.",
    )
    replica_image: str = knob(
        "vllm/vllm-openai:v0.31.0",
        doc="The replicas' image: a vLLM release inside TRL 1.16's supported range (0.22.0-0.31.0), never `latest`.",
    )
    replica_flavor: str = knob(
        "h200",
        doc="One GPU per replica is the reference topology; inference.gpus_per_replica > 1 needs a multi-GPU flavor.",
    )
    trainer_image: str = knob(
        "vllm/vllm-openai:v0.31.0",
        doc="The trainer's image: CUDA torch plus the same vLLM (TRL imports vLLM internals when vLLM is installed). "
        "agrpo is installed into it pinned to the image's vllm/torch/transformers, or comes with it "
        "(trainer_image_has_agrpo).",
    )
    trainer_flavor: str = knob(
        "h200",
        doc='One GPU: launcher "local" runs one trainer process. For h200x2 and up, set trainer_launcher=accelerate.',
    )
    trainer_launcher: TrainerLauncher = knob(
        TrainerLauncher.local,
        doc="Launcher that starts the proxy and the trainer inside the trainer Job: local (one process) or accelerate.",
    )
    install: str = knob(
        "",
        doc="Pinned pip requirement for agrpo in the trainer Job ('agrpo==X.Y.Z', 'agrpo @ https://...whl'). Empty: "
        "the wheel built from the launching code and uploaded to the run's folder, so the Job runs the code that "
        "launched it.",
    )
    python: str = knob(
        "python3", doc="Python inside the images (the replica command is `<python> -m <inference.server_module> ...`)."
    )
    replica_port: int = knob(
        8000, doc="The port vLLM listens on inside a replica Job, exposed as https://<job_id>--<port>.hf.jobs."
    )
    replica_url: str = knob(
        "https://{job_id}--{port}.hf.jobs",
        doc="Exposed-port URL pattern ({job_id}, {port}): how the launcher and the trainer Job reach a replica Job.",
    )
    replica_timeout_s: int = knob(
        6 * 3600,
        doc="Hard stop for replica Jobs: the platform cancels them even if every agrpo process is gone (no orphan "
        "billing).",
    )
    trainer_timeout_s: int = knob(6 * 3600, doc="Hard stop for the trainer Job, enforced by the platform.")
    ready_timeout_s: float = knob(
        1800.0,
        doc="Scheduling + image pull + model load of every replica, after which the launch is abandoned and all "
        "cancelled.",
    )
    poll_interval_s: float = knob(10.0, doc="How often Job stages and replica /health are polled while waiting.")
    trainer_attempts: int = knob(
        1,
        doc="Trainer attempts (1 = no requeue). Above 1 the platform reruns a failed or preempted trainer, which "
        "resumes from the latest checkpoint in the bucket; replicas are kept until the last attempt ends.",
    )
    requeue_grace_s: float = knob(
        300.0,
        doc="After the trainer Job ends in ERROR with attempts left, how long to wait for the platform to requeue it.",
    )
    detach: bool = knob(
        False, doc="Return once the trainer Job is launched: it cancels the replicas itself when it ends."
    )
    secrets: list[str] = knob(
        factory=lambda: ["HF_TOKEN"],
        doc="Secret env names given to every Job; values come from this machine's env (HF_TOKEN: the saved token).",
    )
    labels: dict[str, str] = knob(
        factory=dict,
        doc="Extra labels on every Job (e.g. team=rl); agrpo-run, agrpo-role and agrpo-launch are always set.",
    )
    trainer_image_has_agrpo: bool = knob(
        False,
        doc="trainer_image already holds agrpo (e.g. built from launchers/Dockerfile): the trainer Job installs "
        "nothing.",
    )
    replica_vllm_serve: bool = knob(
        True,
        doc="Start replicas with the image's `vllm serve` CLI; false: `<python> -m <inference.server_module>` (images "
        "without the `vllm` command).",
    )
    estimated_step_s: float = knob(
        30.0,
        doc="Seconds a training step is expected to take, for the dry run's cost range of the whole run "
        "(trainer.max_steps x this, an estimate; 30: the blog's h200x2 trainer, benchmarks/fleet_simulation.py). "
        "Set your own from a run's perf/step_s.",
    )
    install_attempts: int = knob(
        3,
        doc="pip attempts for the trainer Job's install (an index or the network may fail once; each retry waits "
        "longer).",
    )


@dataclass(frozen=True)
class AccelerateConfig:
    """launcher=accelerate: the trainer runs under `accelerate launch` with an FSDP2 config generated from these
    knobs (agrpo/launchers/fsdp.py); the replicas and the proxy are planned exactly as by launcher=local."""

    num_processes: Optional[int] = knob(
        None,
        doc="Trainer processes; None: one per trainer GPU (trainer.gpus, or what the replicas leave). Set it on a CPU "
        "machine, where accelerate runs the ranks with gloo (and without FSDP: see docs/multi_gpu_and_sweeps.md).",
    )
    reshard_after_forward: bool = knob(
        True,
        doc="Free the gathered weights of each layer after its forward (all-gather again in backward): the "
        "memory-lean choice FSDP is for. False trades memory for one all-gather less per layer and step.",
    )
    activation_checkpointing: bool = knob(
        False,
        doc="Recompute each decoder layer's activations in backward (FSDP wraps the layers). Long completions need "
        "it; it replaces trainer.gradient_checkpointing under FSDP (both at once is refused).",
    )
    mixed_precision: MixedPrecision = knob(
        MixedPrecision.bf16,
        doc="Compute dtype of the FSDP units; trainable LoRA weights stay fp32 masters. bf16: the H100/H200 default.",
    )
    cpu_offload: bool = knob(
        False,
        doc="Keep sharded parameters (and optimizer state) on CPU between uses: fits bigger models, costs PCIe "
        "traffic.",
    )
    transformer_layer_cls: Optional[str] = knob(
        None, doc="Decoder-layer class FSDP wraps, e.g. Qwen2DecoderLayer; None: the model's own `_no_split_modules`."
    )
    untie_embeddings: bool = knob(
        True,
        doc="Give lm_head its own copy of tied input embeddings before FSDP wraps the model: FSDP2 refuses a "
        "parameter shared by two FSDP groups. Both stay frozen (LoRA never targets them), so the values never "
        "diverge.",
    )
    main_process_port: int = knob(
        29500,
        doc="First port tried for the ranks' rendezvous; a free one is picked, so runs and sweep points never clash.",
    )
    extra_args: list[str] = knob(
        factory=list,
        doc='Extra `accelerate launch` flags appended verbatim, e.g. ["--dynamo_backend", "no"].',
    )


@dataclass(frozen=True)
class LauncherConfig:
    """How the run's processes start (launcher=NAME picks one)."""

    name: str = knob(
        "local",
        doc="The launcher: local, accelerate, hf_jobs, or a module agrpo/launchers/<name>.py (launcher=NAME sets it).",
    )
    dry_run: bool = knob(False, doc="Print the plan (processes, commands, env names, ports, GPUs) and start nothing.")
    stop_timeout_s: float = knob(20.0, doc="Seconds to wait for a child to exit after SIGTERM before SIGKILL.")
    trainer_during_boot: bool = knob(
        True,
        doc="Start the trainer as the replicas start, so it imports and loads its model while they boot (TRL waits "
        "for their /health). Never where the trainer shares a GPU with a replica: vLLM measures free memory as it "
        "boots. false: the trainer starts once every service is healthy.",
    )
    accelerate: AccelerateConfig = group(AccelerateConfig)  # launcher=accelerate only (ignored by the others)
    hf_jobs: HFJobsConfig = group(HFJobsConfig)  # launcher=hf_jobs only (ignored by the others)
