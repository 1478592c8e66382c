"""An agent's rollout loop: agrpo's, measuring where each turn of an episode was served (agents/metrics.py says why).

TRL 1.16's `_AsyncRolloutLoop` reads only the JSON of a completion, so it cannot tell which replica served a turn.
`AgentTurnsMixin` changes two methods of agrpo's loop and nothing of the rollout itself: `_post` is TRL's own
request plus a note of the adapter requested and the proxy's `X-Agrpo-Replica` answer, kept per episode in a context
variable (each episode is one asyncio task); `_push_rollout_metrics`, which TRL calls once at the end of every
episode, adds the episode's counters to the metrics TRL sends to the trainer. A run with an agent spawns
`AgentRolloutLoop` (module-level, so TRL's spawned process imports it by name; agrpo/trainer/loop_install.py installs
it).
"""

from __future__ import annotations

import contextvars
from typing import Any

import aiohttp

from agrpo.agents.metrics import AFFINITY_RATE, ON_PREFIX, ROUTED, continuation_counts
from agrpo.proxy.upstream import REPLICA_HEADER
from agrpo.trainer.rollout_child import PacedRolloutLoop

_TURNS: contextvars.ContextVar[list[tuple[str | None, str | None]] | None] = contextvars.ContextVar(
    "agrpo_episode_turns", default=None
)


class AgentTurnsMixin:
    """Per-turn routing counters; kept apart from the concrete class, as the pacing is (rollout_child.py)."""

    async def _generate_one(self, *args: Any, **kwargs: Any):
        token = _TURNS.set([])
        try:
            return await super()._generate_one(*args, **kwargs)
        finally:
            _TURNS.reset(token)

    async def _post(self, path: str, payload: dict, timeout: float, max_retries: int = 3) -> dict:
        turns = _TURNS.get()
        if turns is None or path != "/v1/completions":
            return await super()._post(path, payload, timeout, max_retries)
        client_timeout = aiohttp.ClientTimeout(total=timeout)

        async def post_and_note() -> dict:  # TRL's `_post`, plus the note
            url = f"{self.vllm_server_url}{path}"
            async with self.session.post(url, json=payload, timeout=client_timeout) as response:
                response.raise_for_status()
                content = await response.json()
                turns.append((payload.get("model"), response.headers.get(REPLICA_HEADER)))
                return content if content else {}

        return await self._retry(post_and_note, label=f"POST {path}", max_attempts=max_retries)

    def _push_rollout_metrics(self, **kwargs: Any) -> None:
        turns = _TURNS.get()
        if turns is not None:
            counts = continuation_counts(turns)
            for key, value in counts.items():
                self._counters[key] += value
            if counts[ROUTED]:
                rate = self._rates[AFFINITY_RATE]
                rate[0] += counts[ON_PREFIX]
                rate[1] += counts[ROUTED]
        super()._push_rollout_metrics(**kwargs)


class AgentRolloutLoop(AgentTurnsMixin, PacedRolloutLoop):
    """agrpo's rollout loop (paced, guarded, keyed: agrpo/trainer/rollout_child.py) plus per-turn routing counters
    (runs in TRL's spawned rollout process)."""
