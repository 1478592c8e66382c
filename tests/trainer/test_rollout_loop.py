"""agrpo's rollout loop (agrpo/trainer/rollout_loop.py) against a real HTTP server on loopback: a retired adapter
version ends after one request (TRL would retry it up to 3 x 30 times), its group is dropped unscored, every
request carries the token, and the child's log lines go to the trainer's log file, not the terminal.

The loop is built without TRL's constructor (dataset, tokenizer, queues): only the request path is exercised. The
whole loop runs in the e2e runs (tests/launchers/test_hygiene.py: a keyed replica, no proxy)."""

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

from agrpo.trainer.rollout_loop import DROPPED_COUNTER, AgrpoRolloutLoop, VersionRetired, is_retired


def test_the_trl_methods_it_overrides_are_in_the_compatibility_list():
    from agrpo.trl_compat import TRL_NAMES

    listed = {name.path.removeprefix("_AsyncRolloutLoop.") for name in TRL_NAMES}
    assert {"_generate_one_turn", "_retry", "_post", "_execute_tool_calls"} <= listed
    assert AsyncRolloutWorker._loop_cls in (_AsyncRolloutLoop, AgrpoRolloutLoop)


@pytest.mark.parametrize(
    "status,requested,expected",
    [
        (410, "trl-policy-v3", True),  # agrpo's proxy: retired
        (404, "trl-policy-v2", True),  # one replica, no proxy: an older version it no longer holds
        (404, "trl-policy-v3", False),  # the current version missing is something else: TRL retries
        (500, "trl-policy-v2", False),
        (503, None, False),
    ],
)
def test_which_answers_mean_retired(status, requested, expected):
    assert is_retired(status, requested, "trl-policy-v3") is expected


def loop_at_version(url: str, version: int) -> AgrpoRolloutLoop:
    loop = AgrpoRolloutLoop.__new__(AgrpoRolloutLoop)
    values = dict(max_tokens=4, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0, min_p=None)
    loop.__dict__.update(values, vllm_server_url=url, request_timeout=30, model_name="base", lora_name="trl-policy")
    loop._model_version_value = SimpleNamespace(value=version)
    loop._counters, loop._retired_groups = {"rollout/vllm_retry_total": 0, DROPPED_COUNTER: 0}, set()
    loop._auth = {"Authorization": "Bearer tok"}
    return loop


async def serving(status: int, seen: list):
    async def complete(request):
        seen.append((json.loads(await request.read())["model"], request.headers.get("Authorization")))
        return web.json_response({"error": {"message": "gone"}}, status=status)

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize("status,version_then,version_now", [(410, 3, 3), (404, 2, 3)])
def test_a_retired_version_ends_after_one_request(status, version_then, version_now):
    async def scenario():
        seen = []
        runner, url = await serving(status, seen)
        loop = loop_at_version(url, version_then)
        try:
            async with aiohttp.ClientSession(headers=loop._auth) as loop.session:
                turn = asyncio.ensure_future(loop._generate_one_turn([1, 2, 3]))
                await asyncio.sleep(0)
                loop._model_version_value.value = version_now  # the trainer published a newer version meanwhile
                with pytest.raises(VersionRetired):
                    await asyncio.wait_for(turn, 30)
        finally:
            await runner.cleanup()
        assert seen == [(f"trl-policy-v{version_then}", "Bearer tok")]  # one request, not 3 x 30
        assert loop._counters["rollout/vllm_retry_total"] == 0

    asyncio.run(scenario())


def test_other_errors_keep_trls_retries():
    from accelerate import PartialState

    PartialState()  # TRL logs its retry warning through accelerate's logger

    async def scenario():
        seen = []
        runner, url = await serving(404, seen)
        loop = loop_at_version(url, 3)
        try:
            async with aiohttp.ClientSession() as loop.session:
                with pytest.raises(aiohttp.ClientResponseError):
                    await loop._post("/v1/completions", {"model": "trl-policy-v3"}, 30, max_retries=2)
        finally:
            await runner.cleanup()
        assert len(seen) == 2 and loop._counters["rollout/vllm_retry_total"] == 1

    asyncio.run(scenario())


def test_a_retired_rollout_drops_its_whole_group_unscored(monkeypatch):
    async def retired(self, *args, **kwargs):
        raise VersionRetired("trl-policy-v2: HTTP 410")

    async def scored(self, group):
        return [f"sample of group {group.group_id}"]

    monkeypatch.setattr(_AsyncRolloutLoop, "_generate_one", retired)
    monkeypatch.setattr(_AsyncRolloutLoop, "_score_group", scored)
    loop = loop_at_version("http://127.0.0.1:9", 3)

    async def scenario():
        result = await loop._generate_one([{"role": "user", "content": "x"}], tool_dict={}, tools=[], group_id=7)
        assert result == ([], [], [], 0, 0, None)  # TRL's bookkeeping stays whole; nothing of it is trained
        assert await loop._score_group(SimpleNamespace(group_id=7)) == []
        assert await loop._score_group(SimpleNamespace(group_id=8)) == ["sample of group 8"]

    asyncio.run(scenario())
    assert loop._counters[DROPPED_COUNTER] == 1 and loop._retired_groups == set()


def test_the_childs_log_lines_go_to_the_trainer_log_not_the_terminal(tmp_path):
    log_file = tmp_path / "trainer.log"
    code = (
        "import logging, warnings\n"
        "from agrpo.trainer.console.child_logging import log_to_trainer_log\n"
        f"log_to_trainer_log({str(log_file)!r})\n"
        "logging.getLogger('trl.experimental.async_grpo.async_rollout_worker').warning('POST failed; retry 1/3')\n"
        "warnings.warn('a warning from a library')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "retry 1/3" not in result.stderr and "a warning from a library" not in result.stderr
    text = log_file.read_text()
    assert "WARNING trl.experimental.async_grpo.async_rollout_worker: POST failed; retry 1/3" in text
    assert "a warning from a library" in text


def test_trls_retry_warnings_stay_off_the_console_whoever_set_up_the_childs_logging():
    import inspect
    import logging

    from agrpo.trainer.console.logs import ConsoleFilter

    assert "; retry {attempt + 1}/{max_attempts}" in inspect.getsource(_AsyncRolloutLoop._retry)  # TRL's wording
    record = logging.LogRecord(
        "trl.experimental.async_grpo.async_rollout_worker",
        logging.WARNING,
        __file__,
        1,
        "POST /v1/completions failed (ClientResponseError: 404, message='Not Found'); retry 1/3 in 1s",
        None,
        None,
    )
    assert ConsoleFilter(logging.INFO).filter(record) is False
