"""agrpo's rollout loop: TRL's `_AsyncRolloutLoop` plus what keyed replicas and retired adapter versions need.

TRL runs the loop in a spawned child and passes its class by reference, so the child imports this module and gets
these overrides (a monkeypatch in the parent would not reach it). Installed by agrpo/trainer/trl_patches.py.

- Every request carries `Authorization: Bearer <token>` (`trainer_bearer`): the replica's API key when the trainer
  talks to its one replica directly, the proxy's admin token otherwise (the proxy drops it before forwarding).
- A rollout whose adapter version was retired (agrpo's proxy answers 410; one replica without a proxy answers 404
  for a version other than the current one) ends at once and its whole group is dropped: the version was unloaded
  because it is more than max_staleness behind, so the trainer would drop the group as stale anyway. TRL would
  retry it up to 3 x 30 times with waits up to 16 s: 208 warning lines on the console after a replica was killed,
  and a child still sleeping in its back-off when the trainer stopped it ("Child did not exit within 15s").
- The child's log records go to the trainer's log file (the child has no logging set up: TRL's per-request
  warnings reached the terminal). The console shows their count per step instead (agrpo/trainer/console.py).
"""

from __future__ import annotations

import contextvars
import logging
import os

import aiohttp
from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

from agrpo.inference.replica_guard import trainer_bearer
from agrpo.trainer.child_logging import log_to_trainer_log
from agrpo.proxy.retired import RETIRED_STATUS

ROLLOUT_LOG_ENV = "AGRPO_ROLLOUT_LOG"  # the trainer's log file, for the spawned child's records
DROPPED_COUNTER = "rollout/retired_dropped_total"  # rollouts dropped because their adapter version was retired
RETRIED_COUNTER = "rollout/vllm_retry_total"  # TRL's own count of retried requests

log = logging.getLogger(__name__)
_requested_model: contextvars.ContextVar[str | None] = contextvars.ContextVar("agrpo_requested_model", default=None)


class VersionRetired(Exception):
    """The adapter version a rollout asked for is gone from every replica. Not one of TRL's retryable errors."""


def is_retired(status: int, requested: str | None, current: str) -> bool:
    """Whether an HTTP error status means the requested adapter version will never be served again."""
    if status == RETIRED_STATUS:
        return True
    return status == 404 and requested is not None and requested != current


class AgrpoRolloutLoop(_AsyncRolloutLoop):
    """TRL's rollout loop with a bearer token, retired versions dropped at once, and its log in trainer.log."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._retired_groups: set[int] = set()
        token = trainer_bearer()
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        log_to_trainer_log(os.environ.get(ROLLOUT_LOG_ENV))

    async def _generate_loop(self, stop_event):
        if self._auth:  # the session exists now (TRL opens it in _run_loops); every request sends the token
            self.session.headers.update(self._auth)
        return await super()._generate_loop(stop_event)

    async def _generate_one_turn(self, prompt_ids):
        _requested_model.set(self._request_model)  # what this task's payload names (read in _retry)
        return await super()._generate_one_turn(prompt_ids)

    async def _retry(self, coro_factory, *, label, max_attempts=1):
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
        try:
            return await super()._generate_one(*args, **kwargs)
        except VersionRetired as err:
            group_id = kwargs.get("group_id", args[3] if len(args) > 3 else 0)
            self._retired_groups.add(group_id)
            self._counters[DROPPED_COUNTER] += 1
            log.info("dropping group %s: adapter version retired (%s)", group_id, err)
            # An empty rollout keeps TRL's group bookkeeping whole; _score_group drops the group unscored.
            return [], [], [], 0, 0, None

    async def _score_group(self, group):
        if group.group_id in self._retired_groups:
            self._retired_groups.discard(group.group_id)
            return []
        return await super()._score_group(group)
