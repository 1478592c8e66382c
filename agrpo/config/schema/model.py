"""The model, its LoRA adapter, the training data, the reward and the agent: what is trained, on what, for what."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from agrpo.config.schema.choices import ModelDtype
from agrpo.config.schema.knobs import group, knob

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class ModelConfig:
    """The base model the trainer and every replica load."""

    name_or_path: str = knob(
        MISSING,
        doc="Hub id or local folder. The trainer and every vLLM replica load the same string, which is also the name "
        "rollouts request for the base model.",
    )
    builder: Optional[str] = knob(
        None,
        doc="Dotted path of a function `f(path) -> path` that creates the model at `name_or_path` when it is not "
        "there (the smoke recipe builds a tiny model offline). None: the model must already exist or come from the "
        "Hub.",
    )
    builder_input: Optional[str] = knob(
        None,
        doc="Set by agrpo: what model.builder builds from, as JSON text, passed to it beside the path (the warm "
        "start's spec: prepare computes it and writes nothing; the builder writes it beside the folder it builds). "
        "Leave unset.",
    )
    chat_template: Optional[str] = knob(
        None,
        doc="Chat template for the trainer's tokenizer, by TRL's name (e.g. \"qwen2_5\": "
        "trl/chat_templates/qwen2_5.jinja) or a .jinja path. TRL parses responses only for templates it recognises; "
        "a model whose own template differs in wording only (Qwen2.5-Math) trains with a recognised one. None: the "
        "model's own template.",
    )
    dtype: ModelDtype = knob(
        ModelDtype.float32,
        doc="Trainer precision. float32 keeps the trainer and the generator numerically close (TRL's default).",
    )
    trust_remote_code: bool = knob(
        False,
        doc="Run the model repository's own Python code (transformers' trust_remote_code): only for repos you trust.",
    )


@dataclass(frozen=True)
class LoraConfig:
    """The LoRA adapter: the only weights that train and the only ones that travel to the replicas."""

    r: int = knob(
        8, doc="Only the adapter travels to the replicas, so its size sets the sync cost: small ranks sync fast."
    )
    alpha: int = knob(16, doc="LoRA scaling numerator (the update is scaled by alpha / r).")
    dropout: float = knob(0.0, doc="Dropout on the LoRA input during training.")
    target_modules: list[str] = knob(
        factory=lambda: list(ALL_LINEAR),
        doc="Linear layers of the decoder. Never lm_head/embeddings: TRL reads the base head weight for log-probs.",
    )
    use_dora: bool = knob(
        False,
        doc="DoRA cannot be synced adapter-only (vLLM serves plain LoRA deltas); validation rejects it.",
    )
    modules_to_save: Optional[list[str]] = knob(
        None,
        doc="Fully trained modules cannot be synced adapter-only (vLLM serves plain LoRA deltas); validation rejects "
        "them.",
    )


@dataclass(frozen=True)
class DataConfig:
    """The training prompts: where they come from and how each becomes a chat prompt."""

    loader: str = knob(
        MISSING,
        doc="Dotted path of `f(data_cfg, seed) -> datasets.Dataset` with a chat `prompt` column plus reward columns.",
    )
    name: Optional[str] = knob(None, doc="Hub dataset id (data.path wins when both are set).")
    path: Optional[str] = knob(
        None, doc="A local JSONL / Parquet / Arrow file or folder (wins over the Hub id when set)."
    )
    config_name: Optional[str] = knob(None, doc="The Hub dataset's configuration (subset) name, if it has several.")
    split: str = knob("train", doc="The split to train on.")
    columns: dict[str, str] = knob(
        factory=dict,
        doc="Rename source columns to the ones the loader and rewards expect, e.g. {question: problem}.",
    )
    system_prompt: Optional[str] = knob(None, doc="Prompt formatting: an optional system prompt.")
    instruction: Optional[str] = knob(None, doc="Prompt formatting: an instruction appended to each problem.")
    max_prompts: Optional[int] = knob(None, doc="Cap on the number of prompts (None: all); handy for quick runs.")
    shuffle: bool = knob(True, doc="Shuffle the prompts (seeded) before training.")
    prompt_template: Optional[str] = knob(
        None,
        doc='data=jsonl|hub: a Python format string building each prompt from the row\'s columns ("Q: {question}"); '
        "None: the row's own `prompt` column (text or chat messages). Lets a plain question/answer file train with "
        "no code.",
    )


@dataclass(frozen=True)
class RewardConfig:
    """The reward: a weighted sum of terms, each a callable with TRL's reward signature."""

    funcs: list[Any] = knob(
        factory=list,
        doc="A list of reward terms, each `{_target_: dotted.callable, weight: 1.0, ...extra kwargs bound to it}`. "
        "Every callable follows TRL's reward signature and must be importable at module level (TRL pickles it to a "
        "child).",
    )


@dataclass(frozen=True)
class WarmstartConfig:
    """A warm start for a model that does not write tool calls yet (the small CPU models): before the run, a minute
    of supervised steps on episodes built from the run's own tools and a sample of its rows, rendered with its chat
    template, teaches the call format for these tools; GRPO then learns when and how to call. Built once per content
    (base model, tools, rows, settings) under cache_dir/models/warmstart-*, used as the run's model
    (agrpo/agents/warmstart.py, docs/your_agent.md)."""

    enabled: bool = knob(False, doc="Warm-start model.name_or_path on this run's tools before training.")
    tool: Optional[str] = knob(
        None,
        doc="The tool the examples call, by name (a function of agent.tools, or an environment's method). None: "
        "every tool of the run in turn (row i's example calls the (i mod n)-th), so each one's call format is taught "
        "and which tool fits a question is GRPO's to learn.",
    )
    arguments: dict[str, Any] = knob(
        factory=dict,
        doc="Where each argument of the example calls comes from, read from the row (so the values are the row's "
        "real ones): {tool argument: data column} for every tool that takes the argument, or {tool: {argument: "
        "column}} for one tool. An argument not named here takes the column of its own name; a required argument "
        "with neither is refused.",
    )
    answer: str = knob(
        "{output}",
        doc="The final answer of an example after the tool replied: a format string over the tool's answer "
        "(`{output}`) and the row's columns. Examples that do not call answer another row's answer instead (a guess).",
    )
    call_share: float = knob(
        0.15,
        doc="The share of examples whose decision to call is trained: the warm model calls in about that share of "
        "episodes, and GRPO has the rest to learn. The format, the arguments and the answer after a call are "
        "trained in every calling example.",
    )
    rows: int = knob(64, doc="Data rows the examples are built from (the first ones; each is one example).")
    steps: int = knob(200, doc="Supervised steps (1-2 minutes of one CPU core for the tiny model).")
    batch_size: int = knob(8, doc="Examples per supervised step.")
    learning_rate: float = knob(3e-3, doc="AdamW learning rate of the supervised steps (the whole model trains).")
    base_model: Optional[str] = knob(
        None,
        doc="Set by agrpo once the warm start is planned: the model it started from (model.name_or_path then names "
        "the warm-started folder). Leave unset.",
    )


@dataclass(frozen=True)
class AgentConfig:
    """Multi-turn agent rollouts: tools the policy may call and environments that answer (docs/your_agent.md). They
    run in the trainer's rollout worker (TRL's `tools` / `environment_factory`), never on the replicas."""

    tools: list[Any] = knob(
        factory=list,
        doc="Tool functions, named as rewards are: `my_tools.py:search`, a dotted path, or {_target_: ..., option: "
        "value} (options are bound and left out of the schema). TRL shows the model each one's name, type hints and "
        "docstring.",
    )
    environment: Optional[Any] = knob(
        None,
        doc="An environment factory {_target_: my_env.py:Env, option: value} (a class with `reset`, public methods "
        "that are tools, optional `get_reward`), or {name: factory, ...} chosen per row by the data's `environment` "
        "column. None: tools only. One instance per rollout, reused across rollouts (reset between them).",
    )
    max_tool_calling_iterations: Optional[int] = knob(
        4,
        doc="Tool-calling turns per episode (TRL's max_tool_calling_iterations). With it finite, validation checks "
        "that the longest episode fits inference.max_model_len: the prompt with its tool list, one "
        "trainer.max_completion_length per model turn and agent.max_tool_output_chars per tool round (before an "
        "agent.warmstart is built, counted with the tokens it will add: an upper bound). null: no limit (an episode "
        "that outgrows the context ends at the turn vLLM refuses).",
    )
    tool_timeout_s: Optional[float] = knob(
        30.0,
        doc="Seconds one tool call (or an environment's tool method) may take; past it the turn ends with a timeout "
        "error the model sees and TRL counts a failure, so a hung tool never stalls training. Also bounds an "
        "environment's `reset` and `get_reward`, which stop the run when they run past it. null: no limit.",
    )
    max_tool_output_chars: Optional[int] = knob(
        2000,
        doc="Characters of one tool answer the model sees: a longer answer is cut there and ends with a marker "
        "saying how long it was (counted as tools/truncated_total). It bounds what each tool round adds to the "
        "context (validation counts it at ~4 characters per token). null: no cap.",
    )
    warmstart: WarmstartConfig = group(WarmstartConfig)
