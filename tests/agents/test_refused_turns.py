"""Episodes against a stand-in for vLLM on loopback (an aiohttp server answering scripted completions, and 400s as
vLLM words them): a refusal is never retried, a refused later turn ends its episode (counted), a refused first turn
stops the run with vLLM's words, a 6 MB tool answer is cut so the next turn still fits, and a tool call TRL cannot
parse is counted (agrpo/trainer/rollout_loop.py, agent_loop.py; issue 32).

The stand-in replaces vLLM because a real replica would need minutes to boot for each case and cannot be made to
refuse on cue; the loop is TRL's own, built with its constructor, the tiny tokenizer and the user's tools.
tests/e2e/test_agent.py runs the whole loop against real replicas, and test_refused_turns_vllm.py the first two cases
and the 6 MB answer (uncapped) against the session's real replica.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from agrpo.agents.metrics import CALLS_DONE, CONTEXT_FULL_COUNTER, MALFORMED, TRUNCATED
from agrpo.agents.tools import build_tools
from agrpo.trainer.agent_loop import AgentCountsMixin
from agrpo.trainer.rollout_loop import AgrpoRolloutLoop, RequestRefused, error_detail
from tests.agents.loop_episodes import HUGE, counted

TOO_LONG = (
    "This model's maximum context length is 1024 tokens. However, you requested 1090 tokens (1042 in the messages, "
    "48 in the completion). Please reduce the length of the messages or completion."
)
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "blorp"}}\n</tool_call><|im_end|>'


class Loop(AgentCountsMixin, AgrpoRolloutLoop):
    """agrpo's request path and agent counts over TRL's loop (the pacing and guard are not needed here)."""


@pytest.fixture()
def loop_with(user_code, rollout_loop):
    def build(tool_names: list[str], url: str, cap: int | None = 2000) -> Loop:
        (user_code / "huge.py").write_text(HUGE)
        tools = build_tools(tool_names, timeout_s=30, max_chars=cap)
        return rollout_loop(
            cls=Loop,
            max_inflight_tasks=2,
            vllm_server_url=url,
            tools=[tool.method for tool in tools],
            max_tool_calling_iterations=3,
        )

    return build


def completion(tokenizer, text: str) -> dict:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}


def play(loop: Loop, answers: list[tuple[int, object]]) -> tuple[object, list[int]]:
    """One episode of the loop against a server answering `answers` in order ((status, text or JSON body));
    returns (the episode or the exception it raised, each request's prompt length)."""
    seen: list[int] = []

    async def complete(request):
        seen.append(len(json.loads(await request.read())["prompt"]))
        status, body = answers[min(len(seen), len(answers)) - 1]
        if status != 200:
            return web.json_response(
                {"error": {"message": body, "type": "BadRequestError", "code": status}}, status=status
            )
        return web.json_response(completion(loop.tokenizer, body))

    async def scenario():
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        loop.vllm_server_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        tools = loop.tools
        try:
            async with aiohttp.ClientSession() as loop.session:
                prompt = [{"role": "user", "content": "Convert 3 blorps."}]
                return await asyncio.wait_for(
                    loop._generate_one(prompt, tool_dict={t.__name__: t for t in tools}, tools=tools), 60
                )
        except Exception as error:  # the caller asserts on it
            return error
        finally:
            await runner.cleanup()

    return loop._loop.run_until_complete(scenario()), seen


def test_a_refused_later_turn_ends_its_episode_at_once_and_is_counted(loop_with, caplog):
    loop = loop_with(["my_tools.py:search"], "http://127.0.0.1:9")
    caplog.set_level("DEBUG", logger="agrpo.trainer.rollout_loop")
    result, seen = play(loop, [(200, CALL), (400, TOO_LONG)])
    play(loop, [(200, CALL), (400, TOO_LONG)])  # a second one: trainer.log only
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "refused turn" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "DEBUG"]  # one console line, the first time
    assert said[0][1].startswith("vLLM refused turn 2 of an episode (HTTP 400: This model's maximum context length")
    assert "counted as rollout/context_full_total" in said[0][1] and "agent.max_tool_output_chars" in said[0][1]
    assert len(seen) == 2  # the refused turn was sent once: TRL would have sent it up to 3 x 30 times, 16 s apart
    counts = counted(loop)
    assert counts["rollout/vllm_retry_total"] == 0 and counts[CONTEXT_FULL_COUNTER] == 2
    messages, ids, sequences, calls, failures, _ = result
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[1]["content"] == "3 notes about blorp" and messages[2]["content"] == ""
    assert (calls, failures) == (1, 0) and counts[CALLS_DONE] == 2 and counts["tools/search/call_total"] == 2  # 2 plays
    assert len(sequences) == 1 and sum(sequences[0].completion_mask) == len(ids)  # the first turn only is trained
    assert sequences[0].completion_mask[-1] == 1  # it ends with the call: the tool's answer and the stand-in for
    assert len(sequences[0].input_ids) == seen[0] + len(ids)  # the refused turn are neither trained nor forwarded


def test_a_refused_first_turn_stops_with_vllms_words_after_one_request(loop_with):
    loop = loop_with(["my_tools.py:search"], "http://127.0.0.1:9")
    result, seen = play(loop, [(400, TOO_LONG)])
    assert isinstance(result, RequestRefused) and result.status == 400 and result.too_long
    assert "maximum context length is 1024 tokens" in str(result) and len(seen) == 1
    assert loop._counters["rollout/vllm_retry_total"] == 0


def test_a_six_megabyte_tool_answer_is_cut_and_the_episode_goes_on(loop_with):
    loop = loop_with(["my_tools.py:search", "huge.py:huge"], "http://127.0.0.1:9", cap=2000)
    result, seen = play(loop, [(200, CALL.replace('"search"', '"huge"')), (200, "It is 11.1 zinks.<|im_end|>")])
    messages = result[0]
    answer = messages[1]["content"]
    assert answer.startswith("x" * 2000) and "[... 5998000 more characters cut by agrpo" in answer
    assert len(answer) < 2100 and counted(loop)[TRUNCATED] == 1
    assert seen[1] - seen[0] < 2400  # the next turn's prompt grew by the cut answer, not by 6 MB
    assert messages[-1]["content"] == "It is 11.1 zinks."


def test_a_tool_call_trl_cannot_parse_is_counted(loop_with):
    loop = loop_with(["my_tools.py:search"], "http://127.0.0.1:9")
    result, _ = play(loop, [(200, '<tool_call>\n{"name": "search", "argu<|im_end|>')])
    counts = counted(loop)
    assert [m["role"] for m in result[0]] == ["assistant"] and counts[MALFORMED] == 1
    assert counts["tools/malformed_cut_total"] == 1 and counts["tools/malformed_json_total"] == 0  # why, per step
    assert counts["tools/search/call_total"] == 0 and counts[TRUNCATED] == 0  # logged at 0, not left out
    result, _ = play(loop, [(200, "No tool needed.<|im_end|>")])
    assert counted(loop)[MALFORMED] == 0  # a plain answer is not a malformed call


@pytest.mark.parametrize(
    "body,expected",
    [
        (json.dumps({"error": {"message": TOO_LONG, "code": 400}}), TOO_LONG),
        (json.dumps({"detail": [{"loc": ["body", "n"], "msg": "bad"}]}), '[{"loc": ["body", "n"], "msg": "bad"}]'),
        ("<html>Bad Request</html>", "<html>Bad Request</html>"),
    ],
)
def test_the_refusal_keeps_vllms_words(body, expected):
    assert error_detail(body) == expected


def test_a_group_that_called_no_tool_reports_its_tool_figures_at_0(loop_with):
    """TRL leaves tools/call_frequency out of a group without calls: a run that never calls showed no such curve."""
    from accelerate import PartialState
    from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup, TrainingSequence

    PartialState()  # TRL logs the group's reward through accelerate's logger
    loop = loop_with(["my_tools.py:search"], "http://127.0.0.1:9")
    sequence = TrainingSequence(input_ids=[1, 2], completion_mask=[0, 1], old_log_probs=[0.0, -0.5], rollout_id="r")
    prompt, reply = [{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "no"}]
    group = RolloutGroup(
        prompts=[prompt] * 2,
        reward_kwargs={},
        completions=[reply] * 2,
        completions_ids=[[2]] * 2,
        completions_sequences=[[sequence]] * 2,
        tool_call_counts=[0, 0],
        tool_failure_counts=[0, 0],
        model_version=0,
        group_id=0,
        env_rewards=[None, None],
        rollout_rewards=[None, None],
    )
    samples = loop._loop.run_until_complete(loop._score_group(group))
    assert [s.metrics["tools/call_frequency"] for s in samples] == [0.0, 0.0]
    assert [s.metrics["tools/failure_frequency"] for s in samples] == [0.0, 0.0]
