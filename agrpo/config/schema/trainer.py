"""The trainer's knobs: GRPO, the async pipeline, checkpoints and where the trainer runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from agrpo.config.schema.choices import Attention
from agrpo.config.schema.knobs import knob

AUTO = "auto"  # trainer.max_inflight_tasks's one word besides a number


def is_auto(value: Any) -> bool:
    """Whether trainer.max_inflight_tasks asks for the run-time controller (agrpo/trainer/rollout/inflight.py)."""
    return str(value).strip().lower() == AUTO


def fixed_inflight(value: Any) -> int | None:
    """The fixed number of requests in flight a config asks for, or None for `auto`."""
    return None if is_auto(value) else int(str(value))


def staleness_ceiling(samples_per_step: int, group_size: int, weight_sync_steps: int, max_staleness: int) -> int:
    """The most samples ahead of the trainer that can still be trained (the in-flight budget's ceiling, and TRL's
    requests in flight and queue with `auto`): a sample started before vN is published carries v(N-1) at best and
    must be trained within the next max_staleness versions, i.e. the next `samples_per_step x weight_sync_steps x
    max_staleness` samples the trainer takes (one version's worth when max_staleness is 0: nothing is started while
    a version loads). Samples ahead beyond that are thrown away in the steady state, whatever the number of replicas."""
    return max(group_size, samples_per_step * weight_sync_steps * max(max_staleness, 1))


@dataclass(frozen=True)
class TrainerConfig:
    """GRPO and async-pipeline knobs, passed to TRL's AsyncGRPOConfig (see agrpo/trainer/trl_backend.py)."""

    learning_rate: float = knob(1e-5, doc="The optimizer's learning rate (of the LoRA weights).")
    max_steps: int = knob(100, doc="Optimizer steps to train for.")
    per_device_train_batch_size: int = knob(
        32,
        doc="Samples (completions) per optimizer step = per_device_train_batch_size x grad accumulation x processes.",
    )
    gradient_accumulation_steps: int = knob(1, doc="Micro-batches accumulated into one optimizer step.")
    num_generations: int = knob(8, doc="Completions sampled per prompt: GRPO compares them within their group.")
    max_completion_length: int = knob(1024, doc="Most tokens a completion may have.")
    temperature: float = knob(1.0, doc="Sampling temperature of the rollouts (GRPO needs varied samples).")
    top_p: float = knob(1.0, doc="Nucleus sampling of the rollouts.")
    max_staleness: int = knob(
        4,
        doc="Async pipeline: how many weight versions a rollout may lag (older samples are dropped as stale).",
    )
    weight_sync_steps: int = knob(1, doc="Async pipeline: how often (in optimizer steps) the adapter is published.")
    max_inflight_tasks: str = knob(
        AUTO,
        doc="auto: sized at run time from what the trainer consumes and waits for, so that few samples go stale while "
        "the trainer is kept fed (agrpo/trainer/rollout/inflight.py). A number: that many requests in flight, fixed (TRL's "
        "way).",
    )
    inflight_slots: Optional[int] = knob(
        None,
        doc="Derived (None): requests the rollout worker may have in flight: max_inflight_tasks when it is a number; "
        "with auto the most samples the controller may keep ahead of the trainer (its ceiling; the fleet's plan too).",
    )
    queue_maxsize: int = knob(
        -1,
        doc="Rollout samples buffered ahead of the trainer; -1: derived (with auto, the most samples the controller "
        "may keep ahead; with a fixed number, 2 x requests in flight). TRL's fixed default (1024) lets samples go "
        "stale.",
    )
    token_budget: Optional[int] = knob(
        None, doc="Packed token-budget batching; None: the server's max_model_len. <= 0: fixed-size micro-batches."
    )
    gradient_checkpointing: bool = knob(False, doc="Small models train faster without it; large ones need it to fit.")
    bf16: Optional[bool] = knob(None, doc="None: bf16 on GPU, fp32 on CPU.")
    attention: Attention = knob(
        Attention.auto,
        doc="Packed-sequence attention. auto: TRL's FlashAttention-3 Hub kernel where it can run (CUDA 8.x/9.0, bf16, "
        "kernel cached or Hub reachable), else agrpo's SDPA; fa3 | sdpa force one (agrpo/config/attention_choice.py).",
    )
    epsilon: float = knob(0.2, doc="GRPO's clipping range of the probability ratio (lower side, and upper unless set).")
    epsilon_high: Optional[float] = knob(None, doc="Upper clipping range (DAPO's clip-higher); None: epsilon.")
    logging_steps: int = knob(1, doc="Metrics are logged every N steps.")
    save_steps: int = knob(
        50, doc="Checkpoints (adapter + optimizer + rollout position) every save_steps; 0 disables them."
    )
    save_total_limit: Optional[int] = knob(2, doc="Checkpoints kept (the oldest are deleted); None: all.")
    resume: str = knob(
        "false",
        doc="false: start fresh | true: continue from the latest complete checkpoint-N in output_dir (error if none) "
        "| auto: continue when there is one | a checkpoint folder's path. Adapter versions always continue past "
        "every version already published, so a still-running server never sees a name twice "
        "(agrpo/sync/resume.py).",
    )
    seed: int = knob(42, doc="Seed of the trainer and the data order.")
    log_completions: bool = knob(False, doc="Log sample completions with the metrics (TRL's log_completions).")
    gpus: Optional[list[int]] = knob(
        None,
        doc="GPUs for the trainer on a GPU machine (None: what the replicas leave; see agrpo/launchers/gpus.py).",
    )
    cpu_threads: Optional[int] = knob(
        None,
        doc="CPU threads for the trainer on a CPU machine; None: the cores vLLM's CPU build leaves free (it pins one "
        "per replica), at least 1. Oversubscribed OpenMP threads slow both sides down many times over.",
    )
    extra: dict[str, Any] = knob(
        factory=dict,
        doc="Any other AsyncGRPOConfig field, passed through verbatim (validated against TRL's dataclass). Its "
        "`chat_template_kwargs` (e.g. `{enable_thinking: false}`) reach every render of the run's prompts: training, the "
        "agent data check, the warm start's examples, `agrpo eval`.",
    )
