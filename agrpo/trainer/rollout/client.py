"""The rollout child's HTTP side: one aiohttp session to agrpo's proxy (or a lone replica), `/v1/completions` one turn
at a time.

What it does that a plain retrying POST (TRL 1.16's worker) does not:
- every request carries `Authorization: Bearer <token>` (`trainer_bearer`): the replica's API key when the trainer
  talks to its one replica directly, the proxy's admin token otherwise (the proxy drops it before forwarding);
- an answer that means the requested adapter version was retired (the proxy's 410; a lone replica's 404 for a
  version other than the current one) raises `VersionRetired` at once: the version was unloaded because it is more
  than max_staleness behind, so the trainer would drop the group as stale anyway (TRL retried it up to 90 times);
- an answer no retry can change (`REFUSED_STATUSES`: a prompt over max_model_len, a malformed request) raises
  `RequestRefused` with vLLM's own words, sent once (TRL retried a too-long prompt for 8.5 minutes);
- other transport errors are retried with back-off (1, 2, 4, 8, then 16 s, up to `MAX_ATTEMPTS`), counted as
  `rollout/vllm_retry_total` (TRL's figure) and logged to trainer.log, not the console;
- it says which replica served a turn (the proxy's `X-Agrpo-Replica` header), for the agent's routing counters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from agrpo.inference.replica_guard import trainer_bearer
from agrpo.proxy.retired import RETIRED_STATUS
from agrpo.proxy.upstream import REPLICA_HEADER

log = logging.getLogger(__name__)

RETRIED_COUNTER = "rollout/vllm_retry_total"  # TRL's name for re-sent requests
REFUSED_STATUSES = frozenset({400, 413, 422})  # answers a retry cannot change: too long, too large, malformed
TOO_LONG_WORDS = ("maximum context length", "max_model_len", "too long", "context length")
RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionResetError)
MAX_ATTEMPTS = 30


class VersionRetired(Exception):
    """The adapter version a rollout asked for is gone from every replica."""


class RequestRefused(Exception):
    """vLLM (or the proxy, or agrpo's context guard) refused a request for a reason a retry cannot change."""

    def __init__(self, status: int, detail: str, prompt_tokens: int):
        super().__init__(f"HTTP {status}: {detail} (a prompt of {prompt_tokens} tokens)")
        self.status, self.detail, self.prompt_tokens = status, detail, prompt_tokens

    @property
    def too_long(self) -> bool:
        return self.status == 413 or any(words in self.detail.lower() for words in TOO_LONG_WORDS)


@dataclass(frozen=True)
class Turn:
    """What one request brought back: the sampled tokens, their logprobs, and the replica that served them."""

    ids: list[int]
    logprobs: list[float]
    replica: str | None


def error_detail(body: str, limit: int = 400) -> str:
    """The message of an error answer: vLLM's and the proxy's `{"error": {"message": ...}}`, FastAPI's `{"detail":
    ...}`, or the body's first characters."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        found = error.get("message") if isinstance(error, dict) else error or data.get("message") or data.get("detail")
        if found:
            body = found if isinstance(found, str) else json.dumps(found)
    body = " ".join(body.split())
    return body if len(body) <= limit else body[: limit - 3] + "..."


def is_retired(status: int, requested: str, current: str) -> bool:
    """Whether an HTTP error status means the requested adapter version will never be served again."""
    return status == RETIRED_STATUS or (status == 404 and requested != current)


def backoff_s(attempt: int) -> float:
    return float(min(2 ** min(attempt, 4), 16))


class ProxyClient:
    """One session for the child's life (`open`, `close`); `complete` is one turn."""

    def __init__(self, base_url: str, sampling: dict[str, Any], timeout_s: float, connections: int, count: Callable):
        self.base_url = base_url.rstrip("/")
        self.sampling = sampling  # max_tokens, temperature, top_p, top_k, repetition_penalty[, min_p]
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.connections = max(1, connections)
        self.count = count  # Figures.count
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        token = trainer_bearer()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connector = aiohttp.TCPConnector(limit=self.connections)
        self.session = aiohttp.ClientSession(connector=connector, headers=headers)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def complete(self, prompt_ids: list[int], model: str, current_model: Callable[[], str]) -> Turn:
        """One turn from `model` (`<adapter>-vN`, or the base model); `current_model()` is what a request would name
        now, to tell a retired version from one not loaded yet."""
        payload = {
            "model": model,
            "prompt": prompt_ids,
            **self.sampling,
            "n": 1,
            "return_token_ids": True,
            "logprobs": 0,
            # vLLM seeds every engine's sampler alike: a seed per request keeps a group's samples independent
            "seed": random.getrandbits(63),
        }
        for attempt in range(MAX_ATTEMPTS):
            try:
                return await self._send(payload)
            except aiohttp.ClientResponseError as error:
                if is_retired(error.status, model, current_model()):
                    raise VersionRetired(f"{model}: HTTP {error.status}") from error
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                await self._wait(attempt, error)
            except RETRYABLE as error:
                if attempt == MAX_ATTEMPTS - 1:
                    raise
                await self._wait(attempt, error)
        raise AssertionError("unreachable")

    async def _send(self, payload: dict[str, Any]) -> Turn:
        url = f"{self.base_url}/v1/completions"
        async with self.session.post(url, json=payload, timeout=self.timeout) as response:
            if response.status in REFUSED_STATUSES:
                detail = error_detail(await response.text())
                raise RequestRefused(response.status, detail, len(payload["prompt"]))
            response.raise_for_status()
            choice = (await response.json())["choices"][0]
            return Turn(choice["token_ids"], choice["logprobs"]["token_logprobs"], response.headers.get(REPLICA_HEADER))

    async def _wait(self, attempt: int, error: BaseException) -> None:
        self.count(RETRIED_COUNTER)
        sleep = backoff_s(attempt)
        log.debug(
            "POST /v1/completions failed (%s: %s); retry %d/%d in %.0fs",
            type(error).__name__,
            error,
            attempt + 1,
            MAX_ATTEMPTS,
            sleep,
        )
        await asyncio.sleep(sleep)

    async def served_context(self) -> int | None:
        """The replicas' max_model_len from /v1/models; None when they do not say."""
        from agrpo.agents.context_guard import served_context

        try:
            async with self.session.get(f"{self.base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=30)) as r:
                return served_context(await r.json()) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
