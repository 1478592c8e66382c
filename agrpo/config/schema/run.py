"""The console and metrics, evaluation, and RunConfig: the root that holds every group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from agrpo.config.schema.choices import LogLevel, Role
from agrpo.config.schema.inference import InferenceConfig, SyncConfig
from agrpo.config.schema.knobs import group, knob
from agrpo.config.schema.launcher import LauncherConfig
from agrpo.config.schema.model import AgentConfig, DataConfig, LoraConfig, ModelConfig, RewardConfig
from agrpo.config.schema.trainer import TrainerConfig
from agrpo.proxy.settings import ProxySettings


@dataclass(frozen=True)
class LoggerConfig:
    """What the console shows and where the metrics go."""

    report_to: list[str] = knob(
        factory=lambda: ["tensorboard"],
        doc="Integrations for TRL's metrics; TensorBoard event files land in <output_dir>/tensorboard.",
    )
    progress_bar: bool = knob(True, doc="Progress bar on the console.")
    bottleneck_every_steps: int = knob(
        10,
        doc="Print which side of the pipeline is slow (and the knob to turn) every N steps and at the end; 0 disables.",
    )
    level: LogLevel = knob(
        LogLevel.INFO,
        doc="Console level: agrpo's own lines at this level and above; other libraries show WARNING and above (all "
        "of it, at full detail, goes to <run_dir>/logs/trainer.log whatever this says).",
    )
    console_every: int = knob(
        10,
        doc="One compact metrics line (reward, KL, length, step time, stale share, sync) every N steps; 0: the bar "
        "only.",
    )
    console_every_s: float = knob(
        60.0,
        doc="...and, with console_every > 0, after the first step and whenever this many seconds passed without a "
        "line, so a slow model (a real one on a CPU) shows its pace in the first minute.",
    )


@dataclass(frozen=True)
class EvalConfig:
    """`agrpo eval +recipe=NAME`: score the base model or an adapter on a test split (docs/eval.md)."""

    path: Optional[str] = knob(
        None,
        doc="The problems: a local file (wins), else a short name or Hub id (e.g. aime_2024), else data.name with "
        "`split`.",
    )
    name: Optional[str] = knob(None, doc="The problems' short name (e.g. aime_2024) or Hub id, when path is unset.")
    split: str = knob("test", doc="The split of eval.name (or of data.name) to score.")
    max_problems: Optional[int] = knob(
        None, doc="First N problems only (in file order, no shuffling), for quick checks; None: all."
    )
    k: int = knob(4, doc="Samples per problem: mean@k averages them, pass@k asks whether any is correct.")
    temperature: float = knob(0.6, doc="Sampling temperature of the k samples.")
    top_p: float = knob(1.0, doc="Nucleus sampling of the k samples.")
    max_tokens: Optional[int] = knob(
        None,
        doc="Completion tokens per sample; None: trainer.max_completion_length (what the reward's length rule "
        "assumes).",
    )
    adapter: Optional[str] = knob(
        None,
        doc="A peft adapter folder (e.g. <run>/final_adapter), loaded on the replicas by name; None: the base model.",
    )
    seed: int = knob(
        0,
        doc="Per-problem sampling seeds are seed + problem index, so base and adapter see the same random draws.",
    )
    concurrency: int = knob(16, doc="Requests in flight (one request per problem asks for k samples).")
    correct_term: int = knob(
        0,
        doc='Which reward term decides "correct" for pass@k (its unweighted score >= correct_threshold).',
    )
    correct_threshold: float = knob(1.0, doc='The unweighted score of correct_term that counts as "correct".')
    output_dir: Optional[str] = knob(
        None,
        doc="Where results go; None: <run dir>/eval/<date_time> for a run's final_adapter (`agrpo push` reads it "
        "there), else outputs/eval/<run_name>/<date_time>.",
    )
    results_file: str = knob("eval_results.jsonl", doc="One line per problem, in eval.output_dir.")
    summary_file: str = knob("eval_summary.json", doc="The scores (mean@k, pass@1, pass@k ...), in eval.output_dir.")


@dataclass(frozen=True)
class RunConfig:
    """One run: every group, plus the few keys that belong to the run as a whole."""

    model: ModelConfig = group(ModelConfig)
    lora: LoraConfig = group(LoraConfig)
    data: DataConfig = group(DataConfig)
    reward: RewardConfig = group(RewardConfig)
    agent: AgentConfig = group(AgentConfig)
    trainer: TrainerConfig = group(TrainerConfig)
    inference: InferenceConfig = group(InferenceConfig)
    proxy: ProxySettings = group(ProxySettings)
    sync: SyncConfig = group(SyncConfig)
    launcher: LauncherConfig = group(LauncherConfig)
    logger: LoggerConfig = group(LoggerConfig)
    eval: EvalConfig = group(EvalConfig)
    run_name: str = knob("agrpo", doc="A name for the run (run directory, TensorBoard, Job labels).")
    role: Role = knob(
        Role.all,
        doc='"all": the launcher starts replicas (+ proxy) and the trainer. "trainer": only the trainer, against '
        "inference.urls (used inside a trainer Job).",
    )
    cache_dir: str = knob(
        "${oc.env:AGRPO_CACHE,${oc.env:HOME}/.cache/agrpo}",
        doc="Where built models and other reusable artefacts are cached.",
    )
    data_dir: Optional[str] = knob(
        "${oc.env:AGRPO_DATA_DIR,null}",
        doc="Local copies of public datasets (offline machines), e.g. data.path=${data_dir}/gsm8k/train.jsonl. Set it "
        "here or in AGRPO_DATA_DIR; unset (null) is fine for recipes that read no local file, and validation names "
        "both when a recipe needs it.",
    )
