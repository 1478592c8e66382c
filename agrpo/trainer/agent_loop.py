"""An agent's rollout loop: agrpo's, measuring where each turn of an episode was served (agents/metrics.py says why).

TRL 1.16's `_AsyncRolloutLoop` reads only the JSON of a completion, so it cannot tell which replica served a turn.
`AgentTurnsMixin` changes two methods of agrpo's loop and nothing of the rollout itself: `_post` is TRL's own
request plus a note of the adapter requested and the proxy's `X-Agrpo-Replica` answer, kept per episode in a context
variable (each episode is one asyncio task); `_push_rollout_metrics`, which TRL calls once at the end of every
episode, adds the episode's counters to the metrics TRL sends to the trainer. It also counts what TRL leaves silent
(`AgentCountsMixin`): tool answers cut at `agent.max_tool_output_chars`, replies that open a tool call TRL cannot
parse (TRL reads them as plain text), and calls with a known outcome (so the failed share is exact while calls are
still running); and it reports tool figures at 0 instead of leaving them out. A run with an agent spawns
`AgentRolloutLoop` (module-level, so TRL's spawned process imports it by name; agrpo/trainer/loop_install.py installs
it).
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

import aiohttp

from agrpo.agents.metrics import (
    AFFINITY_RATE,
    CALLS_DONE,
    FAILURES_DONE,
    MALFORMED,
    ON_PREFIX,
    ROUTED,
    TRUNCATED,
    continuation_counts,
)
from agrpo.agents.malformed import REASON_KEYS, malformed_reason, reason_key
from agrpo.agents.context_guard import answer_cap, cut_to_fit, max_chars_per_token, overflow_detail, served_context
from agrpo.agents.tools import CUT_MARK
from agrpo.proxy.upstream import REPLICA_HEADER
from agrpo.trainer.rollout_child import PacedRolloutLoop
from agrpo.trainer.rollout_loop import RequestRefused

_TURNS: contextvars.ContextVar[list[tuple[str | None, str | None]] | None] = contextvars.ContextVar(
    "agrpo_episode_turns", default=None
)


class AgentTurnsMixin:
    """Per-turn routing counters; kept apart from the concrete class, as the pacing is (rollout_child.py)."""

    async def _generate_one(self, *args: Any, **kwargs: Any):
        """TRL's episode; agrpo starts a fresh list of the turns' (adapter, replica) notes for its routing counters
        (TRL does not say which replica served a turn)."""
        token = _TURNS.set([])
        try:
            return await super()._generate_one(*args, **kwargs)
        finally:
            _TURNS.reset(token)

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:
        """TRL's POST reads only the JSON; agrpo's also refuses a turn that cannot fit (unsent) and notes the
        adapter asked for and the replica that answered."""
        if path == "/v1/completions":  # a turn that cannot fit is refused here, unsent (agents/context_guard.py)
            prompt_tokens = len(payload.get("prompt") or ())
            detail = overflow_detail(prompt_tokens, (await self._context())[0])
            if detail:
                raise RequestRefused(400, detail, prompt_tokens)
        turns = _TURNS.get()
        if turns is None or path != "/v1/completions":
            return await super()._post(path, payload, timeout, max_retries)

        def note(response: Any) -> None:
            turns.append((payload.get("model"), response.headers.get(REPLICA_HEADER)))

        return await self._retry(  # agrpo's `_post` (rollout_loop.py: refusals not retried), plus the note
            lambda: self._post_once(path, payload, timeout, answered=note),
            label=f"POST {path}",
            max_attempts=max_retries,
        )

    def _push_rollout_metrics(self, **kwargs: Any) -> None:
        """TRL's per-episode figures; agrpo adds the episode's continuation-routing counters (TRL has none)."""
        turns = _TURNS.get()
        if turns is not None:
            counts = continuation_counts(turns)
            for key, value in counts.items():
                self._counters[key] += value
            if counts[ROUTED]:
                rate = self._rates[AFFINITY_RATE]
                rate[0] += counts[ON_PREFIX]
                rate[1] += counts[ROUTED]
        super()._push_rollout_metrics(**kwargs)


def tool_call_opener(tokenizer: Any) -> re.Pattern:
    """What starts a tool call in the tokenizer's response template (TRL's `add_response_schema` sets it), else
    Qwen's `<tool_call>`."""
    template = getattr(tokenizer, "response_template", None)
    field = ((template or {}).get("fields") or {}).get("tool_calls") or {}
    if field.get("open"):
        return re.compile(re.escape(field["open"]))
    return re.compile(field.get("open_pattern") or re.escape("<tool_call>"))


def is_malformed(text: str, reply: dict[str, Any], opener: re.Pattern) -> bool:
    """A reply that opens a tool call, but from which no call was parsed (pure)."""
    return not reply.get("tool_calls") and opener.search(text) is not None


class AgentCountsMixin:
    """What TRL's agent loop leaves uncounted or missing (module docstring)."""

    async def _generate_one_turn(self, prompt_ids: list[int]):
        """TRL's turn; agrpo also counts replies that open a tool call TRL cannot parse: TRL's `parse_response` then
        falls back to plain text silently, and the episode ends as if the model had answered."""
        from trl.chat_template_utils import parse_response

        ids, logprobs = await super()._generate_one_turn(prompt_ids)
        if ids:
            if not hasattr(self, "_opener"):
                self._opener = tool_call_opener(self.tokenizer)
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            if self._opener.search(text):  # only then is the reply parsed a second time
                reply = parse_response(self.tokenizer, ids, prefix=prompt_ids)
                if is_malformed(text, reply, self._opener):
                    self._counters[MALFORMED] += 1
                    self._counters[reason_key(malformed_reason(text, self._opener))] += 1  # agents/malformed.py
        return ids, logprobs

    async def _execute_tool_calls(self, tool_calls: list[dict[str, Any]], tool_dict: dict[str, Any]):
        """TRL's calls, plus: answers cut at agent.max_tool_output_chars (agrpo/agents/tools.py marks them), and the
        calls and failures of this turn counted together once they are done. TRL counts a call when it starts and its
        failure when it ends, so a run that ends while a hung tool is still running showed 15 failures of 16 calls
        (93.8%) for a tool that never answered."""
        messages, calls, failures = await super()._execute_tool_calls(tool_calls, tool_dict)
        self._counters[TRUNCATED] += sum(CUT_MARK in str(m.get("content", "")) for m in messages)
        length, cap = await self._context()
        messages, cut = cut_to_fit(messages, cap, length or 0)  # an answer no context can hold: cut before rendering
        self._counters[TRUNCATED] += cut
        self._counters[CALLS_DONE] += calls
        self._counters[FAILURES_DONE] += failures
        return messages, calls, failures

    async def _context(self) -> tuple[int | None, int | None]:
        """(the replicas' max_model_len, the answer length no context can hold), read once from /v1/models; None
        when they do not say (vLLM's own refusal then ends the episode, a request later)."""
        if not hasattr(self, "_context_read"):

            async def read() -> tuple[int | None, int | None]:
                try:
                    url, limit = f"{self.vllm_server_url}/v1/models", aiohttp.ClientTimeout(total=30)
                    async with self.session.get(url, timeout=limit) as response:
                        length = served_context(await response.json()) if response.status == 200 else None
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    length = None
                return length, answer_cap(length, max_chars_per_token(self.tokenizer))

            self._context_read = asyncio.ensure_future(read())
        return await self._context_read

    def _push_rollout_metrics(self, **kwargs: Any) -> None:
        """TRL leaves a tool figure out until it counts one; agrpo sends each at 0, so a run that never calls a tool
        says so."""
        for key in (TRUNCATED, CALLS_DONE, FAILURES_DONE, MALFORMED, "tools/unknown_name_total", *REASON_KEYS):
            self._counters[key] += 0
        for tool in self.tools:
            self._counters[f"tools/{getattr(tool, '__name__', tool)}/call_total"] += 0
        super()._push_rollout_metrics(**kwargs)

    async def _score_group(self, group: Any) -> Any:
        """TRL leaves `tools/call_frequency` and `tools/failure_frequency` out of a group that called no tool; agrpo
        sets them to 0, so a run that never calls a tool says so."""
        samples = await super()._score_group(group)
        for sample in samples:
            sample.metrics.setdefault("tools/call_frequency", 0.0)
            sample.metrics.setdefault("tools/failure_frequency", 0.0)
        return samples


class AgentRolloutLoop(AgentTurnsMixin, AgentCountsMixin, PacedRolloutLoop):
    """agrpo's rollout loop (paced, guarded, keyed: agrpo/trainer/rollout_child.py) plus per-turn routing counters
    (runs in TRL's spawned rollout process)."""
