"""One episode: render the conversation, ask for a turn, parse it, call its tools, repeat; then its training rows.

The episode ends because agrpo's loop says so, and says why (`EpisodeEnd`): the model answered without a tool call,
it asked for one more than `max_tool_calling_iterations` allows, or a later turn was refused (its context full:
the episode is scored as it stood, the refused turn adds nothing). A refused first turn is the row's own prompt and
is raised (the run stops naming the row); a retired adapter version is raised (the loop drops the group).

Every turn renders the whole message list again (TRL's choice, kept: it is what lets the reconciler in
sequences.py see a template that rewrites history), names the adapter version current at that moment, and records
which version and which replica served it. An agent's episode (tools or an environment) also counts replies that
open a tool call nothing could parse (agents/malformed.py), answers cut to fit the context (agents/context_guard.py)
and where its turns were routed (agents/metrics.py).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trl.chat_template_utils import parse_response

from agrpo.agents.context_guard import answer_cap, cut_to_fit, max_chars_per_token, overflow_detail
from agrpo.agents.malformed import REASON_KEYS, malformed_reason, reason_key
from agrpo.agents.metrics import (
    AFFINITY_RATE,
    CALLS_DONE,
    CONTEXT_FULL_COUNTER,
    FAILURES_DONE,
    MALFORMED,
    ON_PREFIX,
    REFUSED_COUNTER,
    ROUTED,
    TRUNCATED,
    continuation_counts,
)
from agrpo.agents.prompt_budget import BUDGET_KEYS
from agrpo.agents.tools import CUT_MARK
from agrpo.models.chat_template import TurnRenderer
from agrpo.trainer.rollout.client import ProxyClient, RequestRefused
from agrpo.trainer.rollout.figures import Figures
from agrpo.trainer.rollout.sequences import TurnTokens, rows_from_turns
from agrpo.trainer.rollout.toolbox import Toolbox

log = logging.getLogger(__name__)


class EpisodeEnd(enum.Enum):
    ANSWERED = "answered"  # a reply without a tool call
    TOOL_LIMIT = "tool limit"  # a tool call past max_tool_calling_iterations, not made
    REFUSED = "refused"  # a later turn refused (its context full, most often)


@dataclass
class EpisodeResult:
    completion: list[dict[str, Any]]  # the messages after the prompt: replies and tool answers
    completion_ids: list[int]  # every reply's tokens, in order (for reward functions)
    sequences: list[Any]  # TRL's TrainingSequence rows
    tool_calls: int
    tool_failures: int
    versions: list[int]  # the adapter version each turn asked for
    end: EpisodeEnd
    turns: list[tuple[str, str | None]] = field(default_factory=list)  # (model asked, replica that served)


def tool_call_opener(tokenizer: Any) -> re.Pattern:
    """What starts a tool call in the tokenizer's response template (TRL's `add_response_schema` sets it), else
    Qwen's `<tool_call>`."""
    template = getattr(tokenizer, "response_template", None)
    found = ((template or {}).get("fields") or {}).get("tool_calls") or {}
    if found.get("open"):
        return re.compile(re.escape(found["open"]))
    return re.compile(found.get("open_pattern") or re.escape("<tool_call>"))


def refused_turn_line(turn: int, refused: RequestRefused, counter: str) -> str:
    """The line for a refused later turn: vLLM's words, what happened to the episode, and what to change (pure)."""
    change = f" To keep episodes whole, {BUDGET_KEYS}." if refused.too_long else ""
    return (
        f"vLLM refused turn {turn} of an episode ({refused}); the episode ended there and was scored as it stood "
        f"(counted as {counter}; any further ones are logged in trainer.log only)."
        f"{change}"
    )


@dataclass
class EpisodeRules:
    """What every episode of a run shares."""

    tokenizer: Any
    render: TurnRenderer  # messages + tools -> prompt ids (agrpo/models/chat_template.py)
    max_tool_calls: int | None  # TRL's max_tool_calling_iterations
    fork_threshold: int
    eos_ids: tuple[int, ...]
    agent: bool  # tools or an environment: the agent's counters and the context guard


class Episodes:
    """Plays episodes for the loop (one instance per child)."""

    def __init__(
        self,
        rules: EpisodeRules,
        client: ProxyClient,
        toolbox: Toolbox,
        figures: Figures,
        model_for: Callable[[], tuple[str, int]],
    ):
        self.rules, self.client, self.toolbox, self.figures = rules, client, toolbox, figures
        self.model_for = model_for  # () -> (the model name a request names now, its adapter version)
        self.opener = tool_call_opener(rules.tokenizer) if rules.agent else None
        self.context: asyncio.Future | None = None  # (max_model_len, answer cap), read once for every episode
        self.refusal_said = False

    async def play(self, prompt: list[dict], schema: list[Callable], tools: dict[str, Callable]) -> EpisodeResult:
        """One episode of `prompt`, offering `schema` in the prompt and calling `tools` by name."""
        started = time.monotonic()
        rules = self.rules
        messages, turns = list(prompt), []
        result = EpisodeResult([], [], [], 0, 0, [], EpisodeEnd.ANSWERED)
        while True:
            prompt_ids = rules.render(messages, schema)
            try:
                turn = await self._turn(prompt_ids)
            except RequestRefused as refused:
                if not turns:  # the row's own prompt: the loop stops the run naming it
                    raise
                self._refused(len(turns) + 1, refused)
                result.end = EpisodeEnd.REFUSED
                break
            model, version, served = turn
            result.versions.append(version)
            result.turns.append((model, served.replica))
            turns.append(TurnTokens(prompt_ids, served.ids, served.logprobs))
            reply = parse_response(rules.tokenizer, served.ids, prefix=prompt_ids, tools=schema)
            self._check_call(served.ids, reply)
            result.completion.append(reply)
            result.completion_ids.extend(served.ids)
            messages.append(reply)
            calls = reply.get("tool_calls")
            if calls is None:
                break
            if rules.max_tool_calls is not None and len(turns) > rules.max_tool_calls:
                result.end = EpisodeEnd.TOOL_LIMIT
                break
            answers, made, failed = await self.toolbox.call(calls, tools)
            answers = await self._fitted(answers, made, failed)
            result.tool_calls += made
            result.tool_failures += failed
            result.completion.extend(answers)
            messages.extend(answers)
        result.sequences, tally = rows_from_turns(turns, uuid.uuid4().hex, rules.fork_threshold)
        self._figures(result, tally, len(turns), time.monotonic() - started)
        return result

    async def _turn(self, prompt_ids: list[int]) -> tuple[str, int, Any]:
        """(the model asked, its version, the Turn); a turn that cannot fit is refused here, unsent (agent runs)."""
        if self.rules.agent:
            length, _ = await self._context()
            detail = overflow_detail(len(prompt_ids), length)
            if detail:
                raise RequestRefused(400, detail, len(prompt_ids))
        model, version = self.model_for()
        served = await self.client.complete(prompt_ids, model, lambda: self.model_for()[0])
        return model, version, served

    def _refused(self, turn: int, refused: RequestRefused) -> None:
        counter = CONTEXT_FULL_COUNTER if refused.too_long else REFUSED_COUNTER
        self.figures.count(counter)
        (log.debug if self.refusal_said else log.warning)(refused_turn_line(turn, refused, counter))
        self.refusal_said = True  # the first one on the console, the rest in trainer.log

    def _check_call(self, ids: list[int], reply: dict[str, Any]) -> None:
        """A reply that opens a tool call nothing parsed: TRL's parser reads it as plain text and the episode ends
        as if the model had answered; counted, with its reason."""
        if self.opener is None or not ids or reply.get("tool_calls"):
            return
        text = self.rules.tokenizer.decode(ids, skip_special_tokens=False)
        if self.opener.search(text):
            self.figures.count(MALFORMED)
            self.figures.count(reason_key(malformed_reason(text, self.opener)))

    async def _fitted(self, answers: list[dict], made: int, failed: int) -> list[dict]:
        """The tool answers, each cut to what the context can hold; the turn's calls counted once they are done
        (TRL counts a call when it starts and its failure when it ends: a hung tool showed 15 failures of 16)."""
        if not self.rules.agent:
            return answers
        self.figures.count(TRUNCATED, sum(CUT_MARK in str(m.get("content", "")) for m in answers))
        length, cap = await self._context()
        answers, cut = cut_to_fit(answers, cap, length or 0)
        self.figures.count(TRUNCATED, cut)
        self.figures.count(CALLS_DONE, made)
        self.figures.count(FAILURES_DONE, failed)
        return answers

    async def _context(self) -> tuple[int | None, int | None]:
        if self.context is None:  # the first episode's read; the others await the same one

            async def read() -> tuple[int | None, int | None]:
                length = await self.client.served_context()
                return length, answer_cap(length, max_chars_per_token(self.rules.tokenizer))

            self.context = asyncio.ensure_future(read())
        return await self.context

    def _figures(self, result: EpisodeResult, tally: Any, turns: int, duration_s: float) -> None:
        """The episode's figures under TRL's names, and the agent's counters."""
        f, ids = self.figures, result.completion_ids
        f.rate("completions/mean_length", len(ids))
        f.rate("rollout/samples_per_rollout", len(result.sequences))
        f.rate("rollout/turns_mean", turns)
        if ids:  # cut off by max_tokens: the last token is no end of sequence (TRL's and GRPOTrainer's reading)
            f.rate("completions/clipped_ratio", float(ids[-1] not in self.rules.eos_ids))
        if self.rules.agent:
            f.rate("tools/loop_exhausted_frac", float(result.end is EpisodeEnd.TOOL_LIMIT))
            self._agent_counts(result)
        if tally.transitions:
            f.rate("rollout/fork_frac", tally.fork, tally.transitions)
            f.rate("rollout/realign_frac", tally.realign, tally.transitions)
            f.rate("rollout/drift_tokens_mean", tally.drift_tokens, tally.transitions)
        f.push(
            {
                "rollout/duration_s": duration_s,
                "rollout/turns_max": float(turns),
                "rollout/drift_tokens_max": float(tally.drift_max),
                "completions/max_length": float(len(ids)),
                "completions/min_length": float(len(ids)),
            }
        )

    def _agent_counts(self, result: EpisodeResult) -> None:
        """Routing counters (TRL cannot tell which replica served a turn) and every tool figure sent, at 0 when
        nothing happened, so a run that never calls a tool says so."""
        counts = continuation_counts(result.turns)
        for key, value in counts.items():
            self.figures.count(key, value)
        if counts[ROUTED]:
            self.figures.rate(AFFINITY_RATE, counts[ON_PREFIX], counts[ROUTED])
        for key in (TRUNCATED, CALLS_DONE, FAILURES_DONE, MALFORMED, "tools/unknown_name_total", *REASON_KEYS):
            self.figures.count(key, 0)
        for tool in self.toolbox.all_tools():
            self.figures.count(f"tools/{getattr(tool, '__name__', tool)}/call_total", 0)
