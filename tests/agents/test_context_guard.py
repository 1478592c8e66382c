"""A turn that cannot fit ends its episode in the rollout process before any request (agrpo/agents/context_guard.py,
agrpo/trainer/rollout/episode.py; issue 46): a 6 MB tool answer with the cap lifted is cut at what the context could ever
hold, and the turn it would overflow is not sent. Against a stand-in for vLLM on loopback (it answers /v1/models
with a max_model_len as vLLM does, and scripted completions): a real replica cannot be made to call a tool on cue;
tests/agents/test_refused_turns_vllm.py plays the 6 MB answer against the session's real replica."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from agrpo.agents.context_guard import answer_cap, cut_to_fit, max_chars_per_token, overflow_detail, served_context
from agrpo.agents.metrics import CONTEXT_FULL_COUNTER, TRUNCATED
from agrpo.agents.tools import build_tools
from agrpo.trainer.rollout.client import RequestRefused
from agrpo.trainer.rollout.episode import EpisodeEnd, EpisodeResult
from tests.agents.loop_episodes import HUGE, counted

CALL = '<tool_call>\n{"name": "huge", "arguments": {"query": "all"}}\n</tool_call><|im_end|>'


def test_the_pure_parts():
    assert served_context({"data": [{"id": "base", "max_model_len": 576}, {"id": "a-v3", "max_model_len": 576}]}) == 576
    assert served_context({"data": [{"id": "base"}]}) is None and served_context(None) is None
    assert answer_cap(576, 7) == 4032 and answer_cap(None, 7) is None
    messages = [{"role": "tool", "content": "y" * 50}, {"role": "tool", "content": "short"}]
    kept, cut = cut_to_fit(messages, 10, 4)
    assert cut == 1 and kept[0]["content"].startswith("y" * 10 + "\n[... 40 more characters cut by agrpo: ")
    assert "inference.max_model_len=4 tokens" in kept[0]["content"] and kept[1] == messages[1]
    assert messages[0]["content"] == "y" * 50 and cut_to_fit(messages, None) == (messages, 0)  # left as it was
    assert overflow_detail(575, 576) is None and overflow_detail(10, None) is None
    assert "max_model_len=576" in overflow_detail(576, 576)  # no room for one completion token: vLLM's own rule


def test_the_longest_token_bounds_the_characters_per_token(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert max_chars_per_token(tokenizer) == len("<|endoftext|>")  # bytes, and the longest special token
    tokenizer.add_tokens(["a whole tool list, as the warm start adds it"])
    assert max_chars_per_token(tokenizer) == 44


def play(loop, replies: list[str], max_model_len: int) -> tuple[EpisodeResult | Exception, list[int], float]:
    """One episode against a stand-in answering `replies` in order and /v1/models with `max_model_len`: (the
    episode or what it raised, each completion request's prompt length, the seconds it took)."""
    seen: list[int] = []

    async def complete(request):
        seen.append(len(json.loads(await request.read())["prompt"]))
        ids = loop.episodes.rules.tokenizer.encode(replies[min(len(seen), len(replies)) - 1], add_special_tokens=False)
        return web.json_response({"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]})

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "tiny", "max_model_len": max_model_len}]})

    async def scenario():
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", complete)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        loop.client.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        await loop.client.open()
        try:
            prompt = [{"role": "user", "content": "Give me everything."}]
            toolbox = loop.toolbox
            return await loop.episodes.play(prompt, toolbox.schema_tools(None), toolbox.callable_tools(None))
        except Exception as error:  # the caller asserts on it
            return error
        finally:
            await loop.client.close()
            await runner.cleanup()

    started = time.monotonic()
    return asyncio.run(asyncio.wait_for(scenario(), 60)), seen, time.monotonic() - started


def uncapped_loop(user_code, rollout_loop):
    (user_code / "huge.py").write_text(HUGE)
    tools = build_tools(["huge.py:huge"], timeout_s=30, max_chars=None)  # agent.max_tool_output_chars=null
    return rollout_loop(max_inflight_tasks=2, tools=[t.method for t in tools], max_tool_calling_iterations=3)


def test_a_six_megabyte_answer_uncapped_ends_its_episode_before_any_request(user_code, rollout_loop, caplog):
    loop = uncapped_loop(user_code, rollout_loop)
    result, seen, _ = play(loop, [CALL, "Done.<|im_end|>"], max_model_len=2048)
    assert len(seen) == 1  # the call's turn only: the turn holding the answer was never sent
    assert isinstance(result, EpisodeResult) and result.end is EpisodeEnd.REFUSED, result
    messages = result.completion
    assert [m["role"] for m in messages] == ["assistant", "tool"]  # the refused turn adds nothing
    assert len(result.sequences) == 1 and sum(result.sequences[0].completion_mask) == len(result.completion_ids)
    cap = 2048 * max_chars_per_token(loop.episodes.rules.tokenizer)
    assert len(messages[1]["content"]) < cap + 100 and "more characters cut by agrpo" in messages[1]["content"]
    counts = counted(loop)
    assert counts[CONTEXT_FULL_COUNTER] == 1 and counts[TRUNCATED] == 1
    said = [r for r in caplog.records if "refused turn" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING"  # one console line, which says it was not sent
    assert said[0].getMessage().startswith("vLLM refused turn 2 of an episode (HTTP 400: ")
    assert "not sent" in said[0].getMessage() and "max_model_len=2048" in said[0].getMessage()


def test_a_first_turn_that_cannot_fit_stops_the_run_unsent(user_code, rollout_loop):
    loop = uncapped_loop(user_code, rollout_loop)
    result, seen, _ = play(loop, [CALL], max_model_len=64)
    assert isinstance(result, RequestRefused) and result.too_long and seen == []
    assert "leaves no room in max_model_len=64" in str(result)
