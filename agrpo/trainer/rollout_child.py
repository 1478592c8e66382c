"""TRL's rollout loop, paced and with truthful versions. Runs inside TRL's spawned rollout child.

Two changes to agrpo's guarded loop (agrpo/trainer/guarded_loop.py, itself TRL's `_AsyncRolloutLoop` with a token,
retired versions dropped and failures that end the run), both small overrides:

- **Pacing.** A rollout starts only while the samples ahead of the trainer (started and not yet taken by it) are
  under the budget the trainer sets (agrpo/trainer/inflight.py decides it, agrpo/trainer/rollout_control.py carries
  it), and not while the newest published version is still loading if the served one would be stale by the time
  the sample is trained (with max_staleness 1: while vN loads, a sample of v(N-1) could only be trained if it were
  done before the trainer's current batch, which it will not be). TRL starts every slot at once and lets its queue
  fill; samples then wait until they are too stale to train. Admission is first come, first served, so groups start
  in order.
- **A sample's version is the adapter that generated it.** TRL labels every sample of a group with the version
  current when the group was created, while each request asks for the version current when it is sent: with the
  version moving in the background, a group can hold samples of two adapters under the older label (their staleness
  overstated, so dropped for nothing). Here each sample is labelled with the version its rollout's requests asked
  for (the oldest one, for a conversation of several turns).

The trainer gives it to its worker as the loop class (agrpo/trainer/loop_install.py; TRL passes the class to the child
by reference) and hands it two keyword arguments, `agrpo_control` and `agrpo_max_staleness` (rollout_pacing.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections import deque
from typing import Any

from agrpo.trainer.guarded_loop import GuardedRolloutLoop
from agrpo.trainer.rollout_control import ControlBlock, samples_ahead

ADMIT_POLL_S = 0.005  # how often waiting rollouts look at the trainer's consumption
_VERSIONS_USED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("agrpo_versions", default=None)


def worth_starting(served: int, published: int, max_staleness: int) -> bool:
    """Whether a rollout of the served version may still be trained: not while a version is loading that will make
    it too stale before the trainer's next batch (published counts only in background sync; 0 otherwise)."""
    return served >= published - max(max_staleness - 1, 0)


class PacingMixin:
    """The overrides; kept apart from the concrete class so another mixin can be combined with it."""

    def __init__(self, *, agrpo_control: str | None = None, agrpo_max_staleness: int = 0, **kwargs: Any):
        """TRL's loop; agrpo attaches the control block the trainer paces it with (None: no pacing), since TRL starts
        every rollout at once."""
        super().__init__(**kwargs)
        self._control = ControlBlock.attach(agrpo_control) if agrpo_control else None
        self._max_staleness = agrpo_max_staleness
        self._rollout_versions: dict[str, int] = {}  # rollout id -> the oldest version its requests asked for
        self._waiting: deque[asyncio.Future] = deque()
        self._admitter: asyncio.Task | None = None
        self._counts = {"admitted": 0, "finished": 0, "scored": 0, "produced": 0}

    # ---- versions
    @property
    def _request_model(self) -> str:
        """TRL names `<lora_name>-v<current version>`; agrpo also notes the version for its rollout's label."""
        if self.lora_name is None:
            return self.model_name
        version = self.model_version
        used = _VERSIONS_USED.get()
        if used is not None:
            used.append(version)
        return f"{self.lora_name}-v{version}"

    async def _generate_one(self, prompt, tool_dict, tools, group_id: int = 0):
        """TRL starts every rollout at once; agrpo admits it within the budget first, and records the oldest
        version its requests asked for."""
        await self._admit()
        token = _VERSIONS_USED.set([])
        try:
            result = await super()._generate_one(prompt, tool_dict=tool_dict, tools=tools, group_id=group_id)
            used = _VERSIONS_USED.get()
            if used:
                for sequence in result[2]:  # the rollout's training rows
                    self._rollout_versions[sequence.rollout_id] = min(used)
            return result
        finally:
            _VERSIONS_USED.reset(token)
            self._count("finished", 1)

    async def _score_group(self, group):
        """TRL labels a group's samples with the version current when the group began; agrpo with the version each
        rollout's requests asked for, and counts what was scored and produced for the pacing."""
        samples = await super()._score_group(group)
        rows = itertools.chain.from_iterable(group.completions_sequences)  # the samples' order
        for sample, row in zip(samples, rows):
            sample.model_version = self._rollout_versions.pop(row.rollout_id, sample.model_version)
        self._count("scored", len(group.completions))
        self._count("produced", len(samples))
        figures = {"rollout/samples_generated_total": float(len(samples))}
        if self._control is not None:
            figures["rollout/samples_ahead"] = float(samples_ahead(self._snapshot()))
            figures["rollout/requests_in_flight"] = float(self._counts["admitted"] - self._counts["finished"])
        self.push_figures(figures)
        return samples

    # ---- pacing
    def _count(self, name: str, amount: int) -> None:
        self._counts[name] += amount
        if self._control is not None:
            self._control.set(name, self._counts[name])

    def _snapshot(self) -> dict[str, int]:
        return {**self._counts, "consumed": self._control.get("consumed")}

    def _room(self) -> bool:
        if not worth_starting(self.model_version, self._control.get("published"), self._max_staleness):
            return False
        budget = self._control.get("budget")
        return budget <= 0 or samples_ahead(self._snapshot()) < budget

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
            # stopping: let the waiting rollouts end so TRL's loop can finish
            stopping = self.stop_event is not None and self.stop_event.is_set()
            while self._waiting and (stopping or self._room()):
                ticket = self._waiting.popleft()
                if not ticket.done():  # a cancelled rollout takes no room
                    self._count("admitted", 1)
                    ticket.set_result(None)
            await asyncio.sleep(ADMIT_POLL_S)


class PacedRolloutLoop(PacingMixin, GuardedRolloutLoop):
    """agrpo's loop (token and retired versions: rollout_loop.py; a failing reward ends the run: guarded_loop.py) with
    pacing and per-rollout versions: the one class the rollout child runs."""
