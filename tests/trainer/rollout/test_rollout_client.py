"""The rollout child's HTTP side (agrpo/trainer/rollout/client.py) against a real HTTP server on loopback: every
request carries the bearer token; a retired adapter version ends after one request (TRL's worker retried it up to
3 x 30 times); a refused request is sent once and says vLLM's words; other errors are retried with back-off and
counted under TRL's figure; the replica that served a turn is read from the proxy's header."""

from __future__ import annotations

import asyncio

import pytest

from agrpo.trainer.rollout import client as client_module
from agrpo.trainer.rollout.client import (
    RETRIED_COUNTER,
    ProxyClient,
    RequestRefused,
    VersionRetired,
    error_detail,
    is_retired,
)
from agrpo.trainer.rollout.figures import Figures
from tests.trainer.rollout.stand_in_vllm import completion, stand_in_vllm


@pytest.fixture(autouse=True)
def token_and_no_waits(monkeypatch):
    monkeypatch.setattr(client_module, "trainer_bearer", lambda: "tok")
    monkeypatch.setattr(client_module, "backoff_s", lambda attempt: 0.0)  # the retries' number, not their waits


def talk(url: str, *requests):
    """Run `ProxyClient.complete` for each (prompt, model, current model); results or raised errors, and counters."""
    import queue

    figures = Figures(queue.Queue())

    async def scenario():
        client = ProxyClient(url, {"max_tokens": 4, "temperature": 1.0}, 30, 4, figures.count)
        await client.open()
        try:
            out = []
            for prompt, model, current in requests:
                try:
                    out.append(await client.complete(prompt, model, lambda: current))
                except Exception as error:
                    out.append(error)
            return out
        finally:
            await client.close()

    return asyncio.run(scenario()), figures.counters


@pytest.mark.parametrize(
    "status,requested,expected",
    [
        (410, "trl-policy-v3", True),  # agrpo's proxy: retired
        (404, "trl-policy-v2", True),  # one replica, no proxy: an older version it no longer holds
        (404, "trl-policy-v3", False),  # the current version missing is something else: retried
        (500, "trl-policy-v2", False),
    ],
)
def test_which_answers_mean_retired(status, requested, expected):
    assert is_retired(status, requested, "trl-policy-v3") is expected


def test_a_turn_brings_back_ids_logprobs_and_the_replica_with_the_token_and_sampling_sent():
    with stand_in_vllm(lambda request: completion([5, 6, 0], replica="1")) as (url, server):
        (turn,), counters = talk(url, ([1, 2, 3], "trl-policy-v2", "trl-policy-v2"))
    assert (turn.ids, turn.logprobs, turn.replica) == ([5, 6, 0], [-0.5] * 3, "1")
    (request,) = server.seen
    assert request["authorization"] == "Bearer tok" and request["model"] == "trl-policy-v2"
    assert request["prompt"] == [1, 2, 3] and request["max_tokens"] == 4 and request["logprobs"] == 0
    assert request["return_token_ids"] is True and isinstance(request["seed"], int)
    assert counters.get(RETRIED_COUNTER, 0) == 0


@pytest.mark.parametrize(
    ("status", "asked", "current"), [(410, "trl-policy-v3", "trl-policy-v3"), (404, "trl-policy-v2", "trl-policy-v3")]
)
def test_a_retired_version_ends_after_one_request(status, asked, current):
    with stand_in_vllm(lambda request: (status, {"error": {"message": "gone"}}, {})) as (url, server):
        (error,), counters = talk(url, ([1], asked, current))
    assert isinstance(error, VersionRetired) and server.models() == [asked]  # one request, not 3 x 30
    assert counters.get(RETRIED_COUNTER, 0) == 0


def test_a_refused_request_is_sent_once_with_vllms_words():
    words = "This model's maximum context length is 64 tokens. However, you requested 80 tokens."
    with stand_in_vllm(lambda request: (400, {"error": {"message": words}}, {})) as (url, server):
        (error,), _ = talk(url, ([1] * 70, "m", "m"))
    assert isinstance(error, RequestRefused) and error.too_long and words in str(error)
    assert "a prompt of 70 tokens" in str(error) and len(server.seen) == 1


def test_other_errors_are_retried_and_counted_under_trls_figure():
    answers = iter([(503, {}, {}), (404, {}, {}), completion([4])])  # 404 for the current version: not loaded yet
    with stand_in_vllm(lambda request: next(answers)) as (url, server):
        (turn,), counters = talk(url, ([1], "trl-policy-v3", "trl-policy-v3"))
    assert turn.ids == [4] and len(server.seen) == 3 and counters[RETRIED_COUNTER] == 2


def test_a_request_that_keeps_failing_raises_after_the_last_attempt(monkeypatch):
    monkeypatch.setattr(client_module, "MAX_ATTEMPTS", 3)
    with stand_in_vllm(lambda request: (500, {}, {})) as (url, server):
        (error,), counters = talk(url, ([1], "m", "m"))
    assert error.__class__.__name__ == "ClientResponseError" and len(server.seen) == 3
    assert counters[RETRIED_COUNTER] == 2


def test_error_detail_reads_vllms_fastapis_and_raw_bodies():
    assert error_detail('{"error": {"message": "too long"}}') == "too long"
    assert error_detail('{"detail": [{"msg": "bad"}]}') == '[{"msg": "bad"}]'
    assert error_detail("plain\n text") == "plain text" and error_detail("x" * 500).endswith("...")
