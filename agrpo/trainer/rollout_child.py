"""TRL's rollout loop, paced and with truthful versions. Runs inside TRL's spawned rollout child.

Two changes to `_AsyncRolloutLoop`, both small overrides:

- **Pacing.** A rollout starts only while the samples ahead of the trainer (started and not yet taken by it) are
  under the budget the trainer sets (agrpo/trainer/inflight.py decides it, agrpo/trainer/rollout_control.py carries
  it). TRL starts every slot at once and lets its queue fill; samples then wait until they are too stale to train.
  Admission is first come, first served, so groups start in order and finish together.
- **A sample's version is the adapter that generated it.** TRL labels a group with the version current when the
  group was created, while each rollout asks for the version current when its request is sent: with the version
  moving in the background, members of one group could come from different adapters under one label. Here every
  rollout of a group asks for the group's version (all turns of a conversation too), and the label is the oldest
  version any of its rollouts used. A group whose version has fallen more than `max_staleness` behind the served one
  (its adapter may be unloaded) asks for the served version instead: its label stays the old one, so the trainer
  drops it as stale, truthfully.

The trainer installs it with `worker._loop_cls = PacedRolloutLoop` (TRL passes the class to the child by reference)
and two keyword arguments (`agrpo_control`, `agrpo_max_staleness`); see agrpo/trainer/rollout_pacing.py.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Any

from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

from agrpo.trainer.rollout_control import ControlBlock, samples_ahead

ADMIT_POLL_S = 0.005  # how often waiting rollouts look at the trainer's consumption
_PINNED: contextvars.ContextVar[int | None] = contextvars.ContextVar("agrpo_pinned_version", default=None)


def pinned_version(group_version: int | None, served: int, max_staleness: int) -> int:
    """The version a rollout of a group asks for: the group's, unless it may be unloaded by now."""
    if group_version is None or group_version < served - max_staleness:
        return served
    return group_version


class PacingMixin:
    """The overrides; kept apart from the concrete class so another mixin can be combined with it."""

    def __init__(self, *, agrpo_control: str | None = None, agrpo_max_staleness: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        self._control = ControlBlock.attach(agrpo_control) if agrpo_control else None
        self._max_staleness = agrpo_max_staleness
        self._group_versions: dict[int, list[int]] = {}
        self._waiting: deque[asyncio.Future] = deque()
        self._admitter: asyncio.Task | None = None
        self._counts = {"admitted": 0, "finished": 0, "scored": 0, "produced": 0}

    # ---- versions
    @property
    def _request_model(self) -> str:
        if self.lora_name is None:
            return self.model_name
        served = self.model_version
        version = pinned_version(_PINNED.get(), served, self._max_staleness)
        return f"{self.lora_name}-v{version}"

    def _pin(self, group_id: int) -> int:
        versions = self._group_versions.setdefault(group_id, [])
        version = pinned_version(versions[0] if versions else None, self.model_version, self._max_staleness)
        versions.append(version)
        return version

    async def _generate_one(self, prompt, tool_dict, tools, group_id: int = 0):
        await self._admit()
        token = _PINNED.set(self._pin(group_id))
        try:
            return await super()._generate_one(prompt, tool_dict=tool_dict, tools=tools, group_id=group_id)
        finally:
            _PINNED.reset(token)
            self._count("finished", 1)

    async def _score_group(self, group):
        versions = self._group_versions.pop(group.group_id, None)
        if versions:
            group.model_version = min(versions)
        samples = await super()._score_group(group)
        self._count("scored", len(group.completions))
        self._count("produced", len(samples))
        ahead = samples_ahead({**self._counts, "consumed": self._control.get("consumed")}) if self._control else None
        figures = {"rollout/samples_generated_total": float(len(samples))}
        if ahead is not None:
            figures["rollout/samples_ahead"] = float(ahead)
            figures["rollout/requests_in_flight"] = float(self._counts["admitted"] - self._counts["finished"])
        self._push_metrics(figures)
        return samples

    # ---- pacing
    def _count(self, name: str, amount: int) -> None:
        self._counts[name] += amount
        if self._control is not None:
            self._control.set(name, self._counts[name])

    def _room(self) -> bool:
        budget = self._control.get("budget")
        if budget <= 0:
            return True
        return samples_ahead({**self._counts, "consumed": self._control.get("consumed")}) < budget

    async def _admit(self) -> None:
        if self._control is None or (not self._waiting and self._room()):
            self._count("admitted", 1)
            return
        ticket = asyncio.get_running_loop().create_future()
        self._waiting.append(ticket)
        if self._admitter is None or self._admitter.done():
            self._admitter = asyncio.create_task(self._admit_in_order())
        await ticket

    async def _admit_in_order(self) -> None:
        while self._waiting:
            while self._waiting and self._room():
                ticket = self._waiting.popleft()
                if not ticket.done():  # a cancelled rollout (the worker stopping) takes no room
                    self._count("admitted", 1)
                    ticket.set_result(None)
            await asyncio.sleep(ADMIT_POLL_S)


class PacedRolloutLoop(PacingMixin, _AsyncRolloutLoop):
    """TRL's loop with pacing and per-group versions."""
