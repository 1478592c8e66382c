"""Episodes against a stand-in for vLLM on loopback (an aiohttp server answering scripted completions, and 400s as
vLLM words them): a refusal is never retried, a refused later turn ends its episode (counted), a refused first turn
stops the run with vLLM's words, a 6 MB tool answer is cut so the next turn still fits, and a tool call TRL cannot
parse is counted (agrpo/trainer/rollout/episode.py, client.py; issue 32).

The stand-in replaces vLLM because a real replica would need minutes to boot for each case and cannot be made to
refuse on cue; the loop is agrpo's (agrpo/trainer/rollout/loop.py), built as the rollout child builds it, with the
tiny tokenizer and the user's tools, and its episodes are played one at a time.
tests/e2e/test_agent.py runs the whole loop against real replicas, and test_refused_turns_vllm.py the first two cases
and the 6 MB answer (uncapped) against the session's real replica.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from agrpo.agents.metrics import CALLS_DONE, CONTEXT_FULL_COUNTER, MALFORMED, TRUNCATED
from agrpo.agents.tools import build_tools
from agrpo.trainer.rollout.client import RETRIED_COUNTER, RequestRefused, error_detail
from agrpo.trainer.rollout.episode import EpisodeEnd, EpisodeResult
from tests.agents.loop_episodes import HUGE, counted

TOO_LONG = (
    "This model's maximum context length is 1024 tokens. However, you requested 1090 tokens (1042 in the messages, "
    "48 in the completion). Please reduce the length of the messages or completion."
)
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "blorp"}}\n</tool_call><|im_end|>'


@pytest.fixture()
def loop_with(user_code, rollout_loop):
    def build(tool_names: list[str], cap: int | None = 2000):
        (user_code / "huge.py").write_text(HUGE)
        tools = build_tools(tool_names, timeout_s=30, max_chars=cap)
        return rollout_loop(
            max_inflight_tasks=2,
            tools=[tool.method for tool in tools],
            max_tool_calling_iterations=3,
        )

    return build


def completion(tokenizer, text: str) -> dict:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}


def play(loop, answers: list[tuple[int, object]]) -> tuple[EpisodeResult | Exception, list[int]]:
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
        return web.json_response(completion(loop.episodes.rules.tokenizer, body))

    async def scenario():
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        loop.client.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        await loop.client.open()
        try:
            prompt = [{"role": "user", "content": "Convert 3 blorps."}]
            toolbox = loop.toolbox
            return await asyncio.wait_for(
                loop.episodes.play(prompt, toolbox.schema_tools(None), toolbox.callable_tools(None)), 60
            )
        except Exception as error:  # the caller asserts on it
            return error
        finally:
            await loop.client.close()
            await runner.cleanup()

    return asyncio.run(scenario()), seen


def test_a_refused_later_turn_ends_its_episode_at_once_and_is_counted(loop_with, caplog):
    loop = loop_with(["my_tools.py:search"])
    caplog.set_level("DEBUG", logger="agrpo.trainer.rollout.episode")
    result, seen = play(loop, [(200, CALL), (400, TOO_LONG)])
    play(loop, [(200, CALL), (400, TOO_LONG)])  # a second one: trainer.log only
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "refused turn" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "DEBUG"]  # one console line, the first time
    assert said[0][1].startswith("vLLM refused turn 2 of an episode (HTTP 400: This model's maximum context length")
    assert "counted as rollout/context_full_total" in said[0][1] and "agent.max_tool_output_chars" in said[0][1]
    assert len(seen) == 2  # the refused turn was sent once: TRL would have sent it up to 3 x 30 times, 16 s apart
    counts = counted(loop)
    assert counts[RETRIED_COUNTER] == 0 and counts[CONTEXT_FULL_COUNTER] == 2
    assert isinstance(result, EpisodeResult), result
    assert result.end is EpisodeEnd.REFUSED and result.versions == [0]  # one turn served; the refused one adds none
    messages, ids, sequences = result.completion, result.completion_ids, result.sequences
    assert [m["role"] for m in messages] == ["assistant", "tool"]  # the episode as it stood: no reply stands in
    assert messages[1]["content"] == "3 notes about blorp"
    assert (result.tool_calls, result.tool_failures) == (1, 0)
    assert counts[CALLS_DONE] == 2 and counts["tools/search/call_total"] == 2  # 2 plays
    assert len(sequences) == 1 and sum(sequences[0].completion_mask) == len(ids)  # the first turn only is trained
    assert sequences[0].completion_mask[-1] == 1  # it ends with the call: the tool's answer and the refused turn
    assert len(sequences[0].input_ids) == seen[0] + len(ids)  # are neither trained nor forwarded


def test_a_refused_first_turn_stops_with_vllms_words_after_one_request(loop_with):
    loop = loop_with(["my_tools.py:search"])
    result, seen = play(loop, [(400, TOO_LONG)])
    assert isinstance(result, RequestRefused) and result.status == 400 and result.too_long
    assert "maximum context length is 1024 tokens" in str(result) and len(seen) == 1
    counts = counted(loop)
    assert counts[RETRIED_COUNTER] == 0 and counts[CONTEXT_FULL_COUNTER] == 0  # the run stops: no episode counted


def test_a_six_megabyte_tool_answer_is_cut_and_the_episode_goes_on(loop_with):
    loop = loop_with(["my_tools.py:search", "huge.py:huge"], cap=2000)
    result, seen = play(loop, [(200, CALL.replace('"search"', '"huge"')), (200, "It is 11.1 zinks.<|im_end|>")])
    assert isinstance(result, EpisodeResult) and result.end is EpisodeEnd.ANSWERED, result
    messages = result.completion
    answer = messages[1]["content"]
    assert answer.startswith("x" * 2000) and "[... 5998000 more characters cut by agrpo" in answer
    assert len(answer) < 2100 and counted(loop)[TRUNCATED] == 1
    assert seen[1] - seen[0] < 2400  # the next turn's prompt grew by the cut answer, not by 6 MB
    assert messages[-1]["content"] == "It is 11.1 zinks."


def test_a_tool_call_trl_cannot_parse_is_counted(loop_with):
    loop = loop_with(["my_tools.py:search"])
    result, _ = play(loop, [(200, '<tool_call>\n{"name": "search", "argu<|im_end|>')])
    counts = counted(loop)
    assert [m["role"] for m in result.completion] == ["assistant"] and counts[MALFORMED] == 1
    assert result.end is EpisodeEnd.ANSWERED  # read as plain text: the episode ends as if the model had answered
    assert counts["tools/malformed_cut_total"] == 1 and counts["tools/malformed_json_total"] == 0  # why, per step
    assert counts["tools/search/call_total"] == 0 and counts[TRUNCATED] == 0  # logged at 0, not left out
    result, _ = play(loop, [(200, "No tool needed.<|im_end|>")])
    counts = counted(loop)
    assert MALFORMED in counts and counts[MALFORMED] == 0  # a plain answer is not a malformed call


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
    from trl.experimental.async_grpo.async_rollout_worker import TrainingSequence

    from agrpo.trainer.rollout.scorer import Group

    loop = loop_with(["my_tools.py:search"])
    sequence = TrainingSequence(input_ids=[1, 2], completion_mask=[0, 1], old_log_probs=[0.0, -0.5], rollout_id="r")
    prompt, reply = [{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "no"}]
    group = Group(group_id=0, row={"prompt": prompt}, size=2, finished=2)
    for _ in range(2):
        group.prompts.append(prompt)
        group.results.append(EpisodeResult(reply, [2], [sequence], 0, 0, [0], EpisodeEnd.ANSWERED))
        group.env_rewards.append(None)
    samples = asyncio.run(loop.scorer.score(group))
    assert len(samples) == 2
    assert [s.metrics["tools/call_frequency"] for s in samples] == [0.0, 0.0]
    assert [s.metrics["tools/failure_frequency"] for s in samples] == [0.0, 0.0]
