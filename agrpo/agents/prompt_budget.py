"""An agent's prompts as training renders them, and the context budget of its longest episode (the data check's part).

The rollout loop (agrpo/trainer/rollout/episode.py) renders every turn of an episode with the tool list
(`apply_chat_template(messages, tools=...)`, which puts each tool's JSON schema in the prompt, usually in a system turn)
and, when the model's template does not keep earlier turns unchanged, with TRL's training template instead
(`get_training_chat_template`). The tool list is often most of the prompt: a row of 181 tokens rendered alone is 1,042
with two tools and a byte-level tokenizer. So the data check renders sampled rows exactly that way (`TrainingRenderer`),
and checks the worst episode against `inference.max_model_len` (`Budget`): the longest prompt, plus one completion per
model turn, plus each tool round's answer (an answer cut at `agent.max_tool_output_chars` characters with its marker,
counted with the model's own tokenizer on `SAMPLE_ANSWER`: `cut_answer_tokens`) and the template's own tokens around it
(measured by rendering one round). What `reset` returns is folded into the prompt at run time and is not counted here:
the environment is not reset during the check.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from agrpo.agents.build import Agent

# What a tool answer is counted as: words, digits and JSON punctuation, as lookups return. A byte-level tokenizer
# takes one token per character of it, Qwen's about one per 2.5 (a digit is a token of its own there).
SAMPLE_ANSWER = '{"id": 4071, "name": "Ada Lovelace", "room": "B-17", "rate": 0.35, "tags": ["guest", "late"]}, '
CUT_DIGITS = 10**9  # the marker's count of cut characters, as wide as a 1 GB answer would make it
BUDGET_KEYS = (
    "raise inference.max_model_len, or lower agent.max_tool_calling_iterations, agent.max_tool_output_chars or "
    "trainer.max_completion_length (it is per turn)"
)


def cut_answer_tokens(tokenizer: Any, max_chars: int) -> int:
    """Tokens of a tool answer cut at `max_chars` (its marker included), counted with the model's tokenizer on
    `SAMPLE_ANSWER`: the issue 46 run overflowed its context at 1 token per character where the check assumed 4."""
    from agrpo.agents.tools import cut_marker

    text = (SAMPLE_ANSWER * (max_chars // len(SAMPLE_ANSWER) + 1))[:max_chars]
    return len(tokenizer.encode(text + cut_marker(CUT_DIGITS, max_chars), add_special_tokens=False))


def _schema(function: Any) -> dict | None:
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(function)
    except Exception:  # reported by agents/checks.py, which names the tool
        return None


def schemas_by_environment(agent: Agent) -> dict[str | None, list[dict]]:
    """{environment name (None: the run's one environment, or none): the tool schemas a row of it is shown}, in
    TRL's order: the standalone tools, then the environment's public methods."""
    from agrpo.agents.environments import guarded_class, tool_methods

    standalone = [s for s in (_schema(tool.method) for tool in agent.tools) if s is not None]
    classes = agent.environment_classes()
    if not classes:
        return {None: standalone}
    shown = {}
    for name, factory in agent.factories().items():
        guarded = guarded_class(classes[name], factory.timeout_s)
        methods = [_schema(getattr(guarded, method)) for method in tool_methods(classes[name])]
        shown[name] = standalone + [s for s in methods if s is not None]
    return shown


class TrainingRenderer:
    """Token counts of conversations rendered as the rollout loop renders them for a run with tools."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        from agrpo.models.chat_template import TurnRenderer

        self.tokenizer = copy.copy(tokenizer)
        self.render = TurnRenderer(self.tokenizer, template_kwargs)

    def length(self, messages: list[dict[str, Any]], schemas: list[dict], generation: bool = True) -> int:
        return len(self.render(messages, schemas, generation))

    def answer_tokens(self, max_chars: int | None) -> int | None:
        return None if max_chars is None else cut_answer_tokens(self.tokenizer, int(max_chars))

    def round_overhead(self, schemas: list[dict]) -> int:
        """The tokens one tool round adds besides the completion (which holds the call) and the tool's answer: the
        wrapping of an empty answer and the next assistant header (rendered, so every template counts its own)."""
        if not schemas:
            return 0
        asked = [{"role": "user", "content": "-"}]
        name = schemas[0]["function"]["name"]
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        called = [*asked, {"role": "assistant", "content": "", "tool_calls": [call]}]
        answered = [*called, {"role": "tool", "name": name, "content": ""}]
        return max(0, self.length(answered, schemas) - self.length(called, schemas, generation=False))


@dataclass(frozen=True)
class Budget:
    """The worst episode of a run against the context: all counts are tokens but `tool_output_chars`."""

    prompt: int  # the longest rendered prompt, tool list included
    row: str  # its row, as the data check names it (`line 4 of train.jsonl`, or `row 3`)
    row_text: str  # the row as an error shows it
    tools: int  # how many tools its prompt lists
    completion: int  # trainer.max_completion_length: per model turn
    rounds: int | None  # agent.max_tool_calling_iterations; None: no limit
    round_overhead: int
    tool_output_chars: int | None  # agent.max_tool_output_chars; None: no cap
    tool_output: int | None  # tokens of an answer cut at tool_output_chars, marker included (cut_answer_tokens)
    max_model_len: int

    @property
    def episode(self) -> int | None:
        """Tokens of the longest possible episode's last request (prompt + what every turn added + its completion);
        None when the turns or the tool output are unbounded."""
        if self.rounds is None or self.tool_output is None:
            return None
        return (
            self.prompt + (self.rounds + 1) * self.completion + self.rounds * (self.round_overhead + self.tool_output)
        )

    def problem(self) -> str | None:
        """The paragraph when the first turn, or the longest episode, cannot fit inference.max_model_len (pure)."""
        first = self.prompt + self.completion
        with_tools = f"with the list of {self.tools} tool{'s' if self.tools != 1 else ''}" if self.tools else ""
        prompt = f"{self.row}'s prompt is {self.prompt} tokens {with_tools} [{self.row_text}]".replace("  ", " ")
        if first > self.max_model_len:
            return (
                f"{prompt}; with trainer.max_completion_length={self.completion} that is {first} tokens, more than "
                f"inference.max_model_len={self.max_model_len}: vLLM would refuse the first turn of every episode of "
                "this row. Raise inference.max_model_len, shorten the prompts or the tools' docstrings, or lower "
                "trainer.max_completion_length"
            )
        episode = self.episode
        if episode is None or episode <= self.max_model_len:
            return None
        return (
            f"an episode can need {episode} tokens, more than inference.max_model_len={self.max_model_len}: "
            f"{prompt}, then {self.rounds + 1} model turns x trainer.max_completion_length={self.completion} and "
            f"{self.rounds} tool rounds (agent.max_tool_calling_iterations) x ({self.tool_output} tokens of an "
            f"answer cut at agent.max_tool_output_chars={self.tool_output_chars} with its marker, counted with the "
            f"model's tokenizer + {self.round_overhead} of the chat template); vLLM would refuse the turn that no longer fits and that "
            f"episode would end there. {BUDGET_KEYS[0].upper()}{BUDGET_KEYS[1:]}"
        )


class AgentPrompts:
    """The data check's view of an agent run: each sampled row's prompt length as training renders it (its
    environment's tools listed), and the budget paragraph for the longest."""

    def __init__(self, cfg: Any, dataset: Any, tokenizer: Any, agent: Agent):
        from agrpo.models.chat_template import run_template_kwargs

        self.cfg, self.prompts = cfg, dataset["prompt"]
        self.renderer = TrainingRenderer(tokenizer, run_template_kwargs(cfg))
        self.schemas = schemas_by_environment(agent)
        multi = None not in self.schemas
        self.environments = dataset["environment"] if multi and "environment" in dataset.column_names else None

    @classmethod
    def for_run(cls, cfg: Any, dataset: Any, tokenizer: Any) -> AgentPrompts | None:
        """None for a run without tools or an environment, or one whose agent does not build (its own checks say
        why)."""
        try:
            agent = Agent.from_config(cfg.agent)
        except Exception:  # reported by agents/checks.py, naming the entry
            return None
        return None if agent is None else cls(cfg, dataset, tokenizer, agent)

    def schemas_of(self, index: int) -> list[dict]:
        if self.environments is None:
            return next(iter(self.schemas.values()))
        return self.schemas.get(self.environments[index], [])

    def length(self, index: int) -> int:
        return self.renderer.length(self.prompts[index], self.schemas_of(index))

    def problem(self, longest: int, where: int, row_text: str, label: str) -> str | None:
        """`label`: how the data check names row `where` (its file and line, or its place in the data)."""
        section, schemas = self.cfg.agent, self.schemas_of(where)
        budget = Budget(
            prompt=longest,
            row=label,
            row_text=row_text,
            tools=len(schemas),
            completion=int(self.cfg.trainer.max_completion_length),
            rounds=section.max_tool_calling_iterations,
            round_overhead=self.renderer.round_overhead(schemas),
            tool_output_chars=section.max_tool_output_chars,
            tool_output=self.renderer.answer_tokens(section.max_tool_output_chars),
            max_model_len=int(self.cfg.inference.max_model_len),
        )
        return budget.problem()
