"""The only module that knows TRL's API: config mapping, trainer construction, training, final adapter.

`build_grpo_args` and `build_peft_config` are pure mappings from our config (tested without a server);
`run_training` is the I/O: it builds the trainer against a vLLM base URL (a replica or the proxy), trains, and
writes `<output_dir>/final_adapter` and `<output_dir>/metrics.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from agrpo.config.schema import LoraConfig, ModelConfig, RunConfig
from agrpo.errors import ConfigError
from agrpo.models.chat_template import resolve_chat_template
from agrpo.plot import LOG_HISTORY_FILE
from agrpo.sync.resume import checkpoint_to_resume
from agrpo.trainer.sync.retention import default_retain_s, retain_adapter_files
from agrpo.trainer.sync.background import BACKGROUND
from agrpo.trainer.console.bottleneck import Verdict, diagnose, sample_accounting, without_signal
from agrpo.config.schema.trainer import is_auto
from agrpo.trainer.rollout.pacing import attach_pacing
from agrpo.config.schema.inference import is_auto_fleet
from agrpo.fleet.files import fleet_figures
from agrpo.trainer.fleet_signals import FleetSignals
from agrpo.trainer.console.serving_metrics import ServingCollector, log_serving_figures, summary_line
from agrpo.trainer.console.final_metrics import final_metrics
from agrpo.trainer.sync.mode import BackgroundSyncRun
from agrpo.trainer.console.logs import CONSOLE_LOGGER
from agrpo.trainer.sync.tenant_lease import Tenancy, leased, read_share, share_line, tenancy_from_env

log = logging.getLogger(__name__)

FINAL_ADAPTER = "final_adapter"
METRICS_FILE = "metrics.json"
TENSORBOARD_DIR = "tensorboard"


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def build_peft_config(lora_cfg: LoraConfig):
    from peft import LoraConfig

    return LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        use_dora=lora_cfg.use_dora,
        modules_to_save=list(lora_cfg.modules_to_save) if lora_cfg.modules_to_save else None,
        bias="none",
        task_type="CAUSAL_LM",
    )


def build_grpo_args(cfg: RunConfig, vllm_url: str, num_replicas: int, use_gpu: bool):
    """Map the run spec onto TRL's AsyncGRPOConfig. `trainer.extra` passes any other TRL field through (the
    validation pass checked its names against TRL's dataclass)."""
    from trl.experimental.async_grpo import AsyncGRPOConfig

    trainer = cfg.trainer
    output_dir = cfg.sync.output_dir
    kwargs: dict[str, Any] = dict(
        output_dir=output_dir,
        vllm_server_base_url=vllm_url,
        vllm_server_timeout=float(cfg.inference.startup_timeout_s),  # it may start while the replicas boot
        learning_rate=trainer.learning_rate,
        max_steps=trainer.max_steps,
        per_device_train_batch_size=trainer.per_device_train_batch_size,
        gradient_accumulation_steps=trainer.gradient_accumulation_steps,
        num_generations=trainer.num_generations,
        max_completion_length=trainer.max_completion_length,
        temperature=trainer.temperature,
        top_p=trainer.top_p,
        max_staleness=trainer.max_staleness,
        weight_sync_steps=trainer.weight_sync_steps,
        max_inflight_tasks=trainer.inflight_slots,  # with auto, a ceiling: agrpo/trainer/rollout/pacing.py paces
        queue_maxsize=trainer.queue_maxsize,
        token_budget=trainer.token_budget,
        gradient_checkpointing=trainer.gradient_checkpointing,
        bf16=trainer.bf16,
        epsilon=trainer.epsilon,
        epsilon_high=trainer.epsilon_high,
        logging_steps=trainer.logging_steps,
        save_strategy="steps" if trainer.save_steps > 0 else "no",
        save_steps=max(trainer.save_steps, 1),
        save_total_limit=trainer.save_total_limit,
        seed=trainer.seed,
        log_completions=trainer.log_completions,
        dtype=cfg.model.dtype,
        trust_remote_code=cfg.model.trust_remote_code,
        report_to=list(cfg.logger.report_to),
        disable_tqdm=not cfg.logger.progress_bar,
        use_cpu=not use_gpu,
    )
    kwargs.update(trainer.extra)
    return AsyncGRPOConfig(**kwargs)


def broadcast_from_main(accelerator: Any, value: Any) -> Any:
    """The main process's `value` on every rank (one process: the value itself)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    holder = [value]
    broadcast_object_list(holder, from_process=0)
    return holder[0]


class BottleneckCallback(TrainerCallback):
    """Every `every` steps and at the end, log which side of the pipeline is slow
    (agrpo/trainer/console/bottleneck.py)."""

    def __init__(self, every: int):
        self.every = every
        self.window: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self.final: Verdict | None = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "perf/step_s" not in logs:
            return
        self.window.append(dict(logs))
        self.history.append(dict(logs))
        if self.every > 0 and len(self.window) >= self.every:
            self._report(f"steps {state.global_step - len(self.window) + 1}-{state.global_step}", self.window)
            self.window = []

    def on_train_end(self, args, state, control, **kwargs):
        self.final = self._report("whole run", self.history[2:] or self.history)  # skip warm-up steps

    @staticmethod
    def _report(label: str, window: list[dict[str, Any]]) -> Verdict | None:
        verdict = diagnose(window)
        if verdict is not None:  # trainer.log; the console's end summary shows the whole-run verdict
            log.debug("bottleneck (%s): %s", label, verdict.line)
        return verdict


def load_tokenizer(model_cfg: ModelConfig):
    """The model's tokenizer, with `model.chat_template` applied; None lets TRL load it unchanged."""
    if not model_cfg.chat_template:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_cfg.name_or_path, trust_remote_code=model_cfg.trust_remote_code)
    tokenizer.chat_template = resolve_chat_template(model_cfg.chat_template)
    return tokenizer


def gate_loads(trainer: Any, store: Any, timeout_s: float, gate: bool = True) -> None:
    """TRL's blocking sync: before the replicas load a published adapter, wait until the store shows it to them
    (unless `sync.visibility_gate=false`), and record per version, in TensorBoard: `sync/visible_s` (publish ->
    visible to the replicas: the bucket's listing) and `sync/publish_to_loaded_s` (publish -> loaded on every
    replica). `AgrpoVLLMClient.load_lora_adapter` (agrpo/trainer/seam/client.py) does it."""
    client = getattr(trainer, "vllm_client", None)
    if client is None:  # non-main ranks do not talk to vLLM
        return
    from agrpo.trainer.seam.client import Visibility

    def record(key: str, value: float) -> None:
        trainer.record(key, value)

    client.load_through(Visibility(store, timeout_s, record) if gate else None, loaded_record=record)


def choose_sync(trainer: Any, cfg: RunConfig, store: Any, via_proxy: bool) -> Any:
    """`sync.mode`: background (agrpo/trainer/sync/mode.py) or TRL's blocking sync with agrpo's loads. Returns the
    context to train in."""
    timeout_s, gate = cfg.inference.startup_timeout_s, cfg.sync.visibility_gate
    if cfg.sync.mode == BACKGROUND:
        return BackgroundSyncRun(trainer, store, gate, timeout_s, via_proxy)
    gate_loads(trainer, store, timeout_s, gate=gate)
    return contextlib.nullcontext()


def save_final_adapter(trainer: Any, final_dir: Path) -> None:
    """One process: peft's save. Several ranks (accelerate): TRL's collective save, which gathers FSDP2 shards and
    writes on the main process only (each rank's own save_pretrained would write its shard)."""
    if trainer.accelerator.num_processes == 1:
        trainer.model.save_pretrained(final_dir)
    else:
        from trl.experimental.async_grpo.async_grpo_trainer import save_lora_adapter

        model = trainer.accelerator.unwrap_model(trainer.model)
        save_lora_adapter(model, trainer.accelerator, model.active_adapters[0], str(final_dir))
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(final_dir)


def is_paced(cfg: RunConfig) -> bool:
    """Whether the rollout child is paced: an automatic in-flight budget, or adapters published in the background."""
    return is_auto(cfg.trainer.max_inflight_tasks) or cfg.sync.mode == BACKGROUND


def build_trainer(cfg: RunConfig, args: Any, tenant: str | None = None) -> Any:
    """agrpo's AsyncGRPOTrainer (agrpo/trainer/seam/trainer.py) on the run's data, rewards and agent, with agrpo's
    rollout worker (agrpo/trainer/rollout/worker.py); `tenant`: its adapters are served as `<tenant>/trl-policy-vN` (a
    shared fleet)."""
    from agrpo.agents.build import prepare_agent
    from agrpo.config.data_checks import reward_problems
    from agrpo.data import load_train_dataset
    from agrpo.rewards.registry import build_reward_funcs
    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker, loop_arguments
    from agrpo.trainer.seam.fsdp_compat import running_under_fsdp, untie_embeddings
    from agrpo.trainer.seam.trainer import AgrpoAsyncGRPOTrainer  # imports TRL: here, not at the top

    dataset = load_train_dataset(cfg.data, seed=cfg.trainer.seed)
    problems = reward_problems(cfg.reward.funcs, dataset.column_names)  # a Hub dataset is first opened here
    if problems:
        raise ConfigError("; ".join(problems))
    rewards = build_reward_funcs(cfg.reward.funcs) if cfg.reward.funcs else []  # an environment may own the reward
    agent_kwargs = prepare_agent(cfg, args)  # tools, environment_factory ({} without an agent)
    settings = loop_arguments(
        args, dataset, rewards, agent_kwargs.get("tools"), agent_kwargs.get("environment_factory")
    )
    untie = cfg.launcher.accelerate.untie_embeddings and running_under_fsdp()
    return AgrpoAsyncGRPOTrainer(
        model=cfg.model.name_or_path,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(cfg.model),
        peft_config=build_peft_config(cfg.lora),
        rollout_worker=AgrpoRolloutWorker(settings, queue_maxsize=args.queue_maxsize),
        fix_model=untie_embeddings if untie else None,
        tenant=tenant,
    )


@dataclass
class Watchers:
    """What the run's end reads from the callbacks and collectors `watch_run` installed."""

    console: Any
    serving: ServingCollector
    bottleneck: BottleneckCallback


def watch_run(trainer: Any, cfg: RunConfig, vllm_url: str, num_replicas: int, banner: str) -> tuple[Any, Watchers]:
    """(the sync context to train in, the watchers): the adapter sync, the rollout guard, the serving figures, the
    console and the bottleneck verdicts, installed on a built trainer."""
    from agrpo.sync import get_store
    from agrpo.trainer.console.callback import ConsoleCallback, quiet_trainer
    from agrpo.trainer.rollout.guard import guard_rollout_worker  # a failing reward or a hung child ends the run

    via_proxy = cfg.inference.use_proxy  # resolved: the plan put a proxy in front exactly then
    syncing = choose_sync(trainer, cfg, get_store(cfg), via_proxy)
    serving = ServingCollector(vllm_url, via_proxy=via_proxy)
    guard_rollout_worker(trainer, trainer.args.output_dir, cfg.logger.level)
    if trainer.accelerator.is_main_process:  # each log: the fleet's figures, then the serving figures
        if (
            is_auto_fleet(cfg.inference) or cfg.inference.shared_fleet
        ):  # a fleet controller reads the steps (agrpo/fleet/)
            trainer.add_callback(FleetSignals(trainer.args.output_dir))
            trainer.add_log_figures(partial(fleet_figures, trainer.args.output_dir))
        log_serving_figures(trainer, serving)
    quiet_trainer(trainer)
    console = ConsoleCallback(cfg, num_replicas, vllm_url, attention=banner)
    trainer.add_callback(console)
    bottleneck = BottleneckCallback(cfg.logger.bottleneck_every_steps)
    if cfg.logger.bottleneck_every_steps > 0:
        trainer.add_callback(bottleneck)
    return syncing, Watchers(console, serving, bottleneck)


def train(trainer: Any, cfg: RunConfig, syncing: Any) -> None:
    """Resume from the checkpoint `trainer.resume` names, if any, and train with adapter retention, pacing and the
    adapter sync around `train()`."""
    args = trainer.args
    resume_from = (
        checkpoint_to_resume(cfg.trainer.resume, args.output_dir) if trainer.accelerator.is_main_process else None
    )
    resume_from = broadcast_from_main(trainer.accelerator, resume_from)
    if resume_from is not None:
        log.info("Resuming from %s", resume_from)
    retain_s = cfg.inference.adapter_retention_s
    with (
        retain_adapter_files(
            trainer,
            default_retain_s(args.request_timeout) if retain_s is None else retain_s,
            not cfg.inference.use_proxy,
        ),
        attach_pacing(trainer, auto=is_auto(cfg.trainer.max_inflight_tasks))
        if is_paced(cfg)
        else contextlib.nullcontext(),
        syncing,
    ):
        trainer.train(resume_from_checkpoint=resume_from)


def run_summary(trainer: Any, final_dir: Path, watchers: Watchers) -> dict[str, Any]:
    """What metrics.json holds: rewards, step times, samples, serving, agent and bottleneck figures."""
    from agrpo.agents.build import log_agent_summary

    summary = final_metrics(trainer.state.log_history)
    summary["samples"] = sample_accounting(trainer.state.log_history)  # generated, used, dropped as stale, left
    summary["final_adapter"] = str(final_dir)
    summary["global_step"] = trainer.state.global_step
    serving, bottleneck = watchers.serving, watchers.bottleneck
    if serving.last:
        summary["serving"] = serving.last
        log.info("serving: %s", summary_line(serving.last))
    log_agent_summary(summary, trainer.state.log_history)  # tool use, turns, continuation routing (agents only)
    if bottleneck.final is not None:
        reason = watchers.console.notices.no_signal()  # a run that learnt nothing says so, not how its pace was
        final = without_signal(bottleneck.final, reason) if reason else bottleneck.final
        summary["bottleneck"] = {"kind": final.kind, "line": final.line}
    return summary


def write_run_files(trainer: Any, summary: dict[str, Any], final_dir: Path, console: Any) -> None:
    """metrics.json, log_history.json and training_curves.png, then the console's end summary (main process)."""
    output_dir = Path(trainer.args.output_dir)
    (output_dir / METRICS_FILE).write_text(json.dumps(summary, indent=2))
    (output_dir / LOG_HISTORY_FILE).write_text(json.dumps(trainer.state.log_history))
    from agrpo.plot import plot_run_dir

    try:
        plot_run_dir(trainer.args.output_dir)
    except Exception as error:  # matplotlib missing, say: the run itself succeeded
        log.warning("training_curves.png not drawn: %s", error)
    console.print_summary(str(final_dir), summary.get("bottleneck", {}).get("line"), samples=summary.get("samples"))


def run_training(cfg: RunConfig, vllm_url: str, num_replicas: int) -> dict[str, Any]:
    """Train with TRL's AsyncGRPOTrainer against `vllm_url`; return the summary written to metrics.json. On a shared
    fleet (the launcher set AGRPO_TENANT) the lease is renewed from the start (agrpo/trainer/sync/tenant_lease.py)."""
    tenancy = tenancy_from_env(os.environ, vllm_url)
    with leased(tenancy, cfg.inference.shared_fleet):
        return train_run(cfg, vllm_url, num_replicas, tenancy)


def train_run(cfg: RunConfig, vllm_url: str, num_replicas: int, tenancy: Tenancy | None) -> dict[str, Any]:
    started = time.monotonic()
    from agrpo.trainer.seam.attention import trainer_attention
    from agrpo.trainer.seam.module_patches import apply_trl_patches

    use_gpu = cuda_available()
    attention = trainer_attention(cfg)  # FA3 or SDPA for packed sequences, decided before the model loads
    apply_trl_patches(attention.kind)
    args = build_grpo_args(cfg, vllm_url, num_replicas, use_gpu)
    # transformers 5 reads the TensorBoard directory from the environment only.
    os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(args.output_dir, TENSORBOARD_DIR)
    trainer = build_trainer(cfg, args, tenant=tenancy.tenant if tenancy else None)
    syncing, watchers = watch_run(trainer, cfg, vllm_url, num_replicas, attention.banner)
    train(trainer, cfg, syncing)

    final_dir = Path(args.output_dir) / FINAL_ADAPTER
    save_final_adapter(trainer, final_dir)
    summary = run_summary(trainer, final_dir, watchers)
    sync = syncing.summary() if isinstance(syncing, BackgroundSyncRun) else None
    if sync:
        summary["sync"] = sync  # versions loaded and skipped (a newer one came during a load)
    summary["wall_time_s"] = time.monotonic() - started  # model load + training + final save (sweep tables)
    main = trainer.accelerator.is_main_process  # under accelerate every rank gets here; one writes
    if main and tenancy is not None and (share := read_share(tenancy, cfg.inference.shared_fleet)):
        summary["shared_fleet"] = share  # this run's tokens and share of the fleet's replica-seconds
    if main:
        write_run_files(trainer, summary, final_dir, watchers.console)
    if main and "shared_fleet" in summary:
        price = cfg.inference.fleet.replica_price_per_hour
        logging.getLogger(CONSOLE_LOGGER).info(share_line(summary["shared_fleet"], price))
    return summary
