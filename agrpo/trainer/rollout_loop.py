"""agrpo's rollout loop: TRL's `_AsyncRolloutLoop` plus what keyed replicas and retired adapter versions need.

agrpo's rollout worker runs the loop in a spawned child and passes its class by reference, so the child imports this
module and gets these overrides (a monkeypatch in the parent would not reach it). The default loop of
AgrpoRolloutWorker (agrpo/trainer/rollout_worker.py); a run picks a class further along the chain
(agrpo/trainer/loop_install.py).

- Every request carries `Authorization: Bearer <token>` (`trainer_bearer`): the replica's API key when the trainer
  talks to its one replica directly, the proxy's admin token otherwise (the proxy drops it before forwarding).
- A rollout whose adapter version was retired (agrpo's proxy answers 410; one replica without a proxy answers 404
  for a version other than the current one) ends at once and its whole group is dropped: the version was unloaded
  because it is more than max_staleness behind, so the trainer would drop the group as stale anyway. TRL would
  retry it up to 3 x 30 times with waits up to 16 s: 208 warning lines on the console after a replica was killed,
  and a child still sleeping in its back-off when the trainer stopped it ("Child did not exit within 15s").
- A request vLLM (or the proxy) refuses for a reason no retry can change (`REFUSED_STATUSES`: a prompt longer than
  max_model_len, a malformed request) is sent once: TRL retried it like a dropped connection, up to 3 x 30 times 16 s
  apart (960 retries and 8.5 minutes before a too-long prompt stopped a run). A refused first turn is the row's own
  prompt: the run stops with the paragraph naming the keys (agrpo/trainer/guarded_loop.py). A refused later turn of
  an episode (its context filled up with turns and tool answers) ends that episode where it stands, counted
  (`CONTEXT_FULL_COUNTER`, `REFUSED_COUNTER`); the first such turn is one console line with vLLM's words and the keys
  to change, the others go to trainer.log.
- The child's log records go to the trainer's log file (the child has no logging set up: TRL's per-request
  warnings reached the terminal). Each dropped group is a DEBUG line there only (8 of them on the console for one
  frozen replica, before); the console shows one line per kind of event and the counts (agrpo/trainer/console_events.py).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os

import aiohttp
from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

from agrpo.agents.metrics import CONTEXT_FULL_COUNTER, REFUSED_COUNTER
from agrpo.agents.prompt_budget import BUDGET_KEYS
from agrpo.inference.replica_guard import trainer_bearer
from agrpo.trainer.console.child_logging import log_to_trainer_log
from agrpo.proxy.retired import RETIRED_STATUS

ROLLOUT_LOG_ENV = "AGRPO_ROLLOUT_LOG"  # the trainer's log file, for the spawned child's records
DROPPED_COUNTER = "rollout/retired_dropped_total"  # rollouts dropped because their adapter version was retired
RETRIED_COUNTER = "rollout/vllm_retry_total"  # TRL's own count of retried requests
REFUSED_STATUSES = frozenset({400, 413, 422})  # answers a retry cannot change: too long, too large, malformed
TOO_LONG_WORDS = ("maximum context length", "max_model_len", "too long", "context length")

log = logging.getLogger(__name__)
_requested_model: contextvars.ContextVar[str | None] = contextvars.ContextVar("agrpo_requested_model", default=None)
_turn_number: contextvars.ContextVar[int] = contextvars.ContextVar("agrpo_turn_number", default=0)  # per episode
_episode_cut: contextvars.ContextVar[bool] = contextvars.ContextVar("agrpo_episode_cut", default=False)


class VersionRetired(Exception):
    """The adapter version a rollout asked for is gone from every replica. Not one of TRL's retryable errors."""


class RequestRefused(Exception):
    """vLLM (or the proxy) refused a request for a reason a retry cannot change. Not one of TRL's retryable errors."""

    def __init__(self, status: int, detail: str, prompt_tokens: int):
        super().__init__(f"HTTP {status}: {detail} (a prompt of {prompt_tokens} tokens)")
        self.status, self.detail, self.prompt_tokens = status, detail, prompt_tokens

    @property
    def too_long(self) -> bool:
        return self.status == 413 or any(words in self.detail.lower() for words in TOO_LONG_WORDS)


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


def refused_turn_line(turn: int, refused: RequestRefused, counter: str) -> str:
    """The line for a refused later turn: vLLM's words, what happened to the episode, and what to change (pure)."""
    change = f" To keep episodes whole, {BUDGET_KEYS}." if refused.too_long else ""
    return (
        f"vLLM refused turn {turn} of an episode ({refused}); the episode ended there and was scored as it stood "
        f"(counted as {counter}; any further ones are logged in trainer.log only).{change}"
    )


def untrained_cut(result: tuple) -> tuple:
    """An episode ended by a refused turn (`_generate_one_turn`), trimmed for training: the last row ends with its
    last trained token, so neither the end-of-turn token that stood in for the refused turn nor the context that
    made it too long (a 6 MB tool answer: six million tokens) is trained on or even forwarded; the stand-in also
    leaves the completion's ids. A row left with nothing to train is dropped."""
    completion, completion_ids, sequences, *rest = result
    if sequences:
        last = sequences[-1]
        last.completion_mask[-1] = 0  # the stand-in: the one token of the refused turn, last in its row
        end = max((i + 1 for i, mask in enumerate(last.completion_mask) if mask), default=0)
        del last.input_ids[end:], last.completion_mask[end:], last.old_log_probs[end:]
    sequences = [seq for seq in sequences if any(seq.completion_mask)]
    return (completion, completion_ids[:-1], sequences, *rest)


def is_retired(status: int, requested: str | None, current: str) -> bool:
    """Whether an HTTP error status means the requested adapter version will never be served again."""
    if status == RETIRED_STATUS:
        return True
    return status == 404 and requested is not None and requested != current


class AgrpoRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop with a bearer token, retired versions dropped at once, and its log in trainer.log."""

    def __init__(self, *args, **kwargs):
        """TRL's loop; agrpo adds the bearer token for every request and sends this child's log records to
        trainer.log."""
        super().__init__(*args, **kwargs)
        self._retired_groups: set[int] = set()
        token = trainer_bearer()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        log_to_trainer_log(os.environ.get(ROLLOUT_LOG_ENV))
        log.setLevel(
            logging.DEBUG
        )  # its per-group DEBUG lines reach trainer.log whoever set logging up (not the console)

    async def _generate_loop(self, stop_event):
        """TRL's generation loop, on a session that sends agrpo's bearer token (TRL's sends no header)."""
        if self._auth:  # the session exists now (TRL opens it in _run_loops); every request sends the token
            self.session.headers.update(self._auth)
        return await super()._generate_loop(stop_event)

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:
        """TRL's `_post` is one POST retried by `_retry` on any aiohttp error, `raise_for_status` included: a 400
        (a prompt over max_model_len) was retried 3 x 30 times, and its body, where vLLM says why, was dropped. Here
        the same POST (`_post_once`), except that an answer in REFUSED_STATUSES raises RequestRefused with vLLM's
        words, which `_retry` lets through at once (agrpo's change); every other error keeps TRL's retries."""
        return await self._retry(
            lambda: self._post_once(path, payload, timeout), label=f"POST {path}", max_attempts=max_retries
        )

    async def _post_once(self, path: str, payload: dict, timeout: float, answered=None) -> dict:
        """One POST; `answered(response)`, when given, sees a successful answer (agent_loop.py notes its replica)."""
        url = f"{self.vllm_server_url}{path}"
        async with self.session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status in REFUSED_STATUSES:
                detail = error_detail(await response.text())
                raise RequestRefused(response.status, detail, len(payload.get("prompt") or ()))
            response.raise_for_status()
            content = await response.json()
            if answered is not None:
                answered(response)
            return content if content else {}

    async def _generate_one_turn(self, prompt_ids):
        """TRL's turn; with agrpo a turn vLLM refuses (a later one) ends the episode. TRL's `_generate_one` has no
        way to end an episode early, so the refused turn returns a lone end-of-turn token, which TRL reads as an
        empty reply without a tool call (no tokens at all would break TRL's parser); `_generate_one` then takes that
        token out of training. The episode is scored as it stands. A refused first turn is re-raised: the row's prompt itself does
        not fit, and the run stops naming it (guarded_loop.py)."""
        _requested_model.set(self._request_model)  # what this task's payload names (read in _retry)
        turn = _turn_number.get()
        _turn_number.set(turn + 1)
        try:
            return await super()._generate_one_turn(prompt_ids)
        except RequestRefused as refused:
            if turn == 0:
                raise
            counter = CONTEXT_FULL_COUNTER if refused.too_long else REFUSED_COUNTER
            self._counters[counter] += 1
            said = getattr(self, "_refusal_said", False)  # the first one on the console, the rest in trainer.log
            (log.debug if said else log.warning)(refused_turn_line(turn + 1, refused, counter))
            self._refusal_said = True
            _episode_cut.set(True)
            eos = self.tokenizer.eos_token_id
            return [eos if eos is not None else self.eos_token_ids[0]], [0.0]

    async def _retry(self, coro_factory, *, label, max_attempts=1):
        """TRL retries every transport error with back-off; agrpo first turns an answer that means the requested
        adapter version was retired (410, or 404 for an older version) into `VersionRetired`, never retried."""

        async def once():
            try:
                return await coro_factory()
            except aiohttp.ClientResponseError as err:
                requested = _requested_model.get()
                if is_retired(err.status, requested, self._request_model):
                    raise VersionRetired(f"{requested}: HTTP {err.status}") from err
                raise

        return await super()._retry(once, label=label, max_attempts=max_attempts)

    async def _generate_one(self, *args, **kwargs):
        """TRL's episode; agrpo trims an episode cut by a refused turn (`untrained_cut`) and ends a rollout whose
        version was retired with an empty result, so that TRL's group bookkeeping stays whole and the group is dropped."""
        _turn_number.set(0)  # each episode is its own asyncio task: this context is the episode's
        _episode_cut.set(False)
        try:
            result = await super()._generate_one(*args, **kwargs)
            return untrained_cut(result) if _episode_cut.get() else result
        except VersionRetired as err:
            group_id = kwargs.get("group_id", args[3] if len(args) > 3 else 0)
            self._retired_groups.add(group_id)
            self._counters[DROPPED_COUNTER] += 1
            # trainer.log only: the console says it once per kind of event (agrpo/trainer/console_events.py)
            log.debug("dropping group %s: adapter version retired (%s)", group_id, err)
            # An empty rollout keeps TRL's group bookkeeping whole; _score_group drops the group unscored.
            return [], [], [], 0, 0, None

    async def _score_group(self, group):
        """TRL scores every group; agrpo drops a group with a retired rollout unscored (it would be stale)."""
        if group.group_id in self._retired_groups:
            self._retired_groups.discard(group.group_id)
            return []
        return await super()._score_group(group)
