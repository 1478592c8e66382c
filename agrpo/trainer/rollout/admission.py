"""When a rollout may start: under the trainer's in-flight budget, first come first served.

TRL's worker starts every slot at once and lets its queue fill; samples then wait until they are too stale to train.
Here a rollout starts only while the samples ahead of the trainer (started and not yet scored, plus scored and not
yet taken) are under the budget the trainer sets (inflight.py decides it, the shared `ControlBlock` of control.py
carries it), and not while the newest published adapter is still loading if the served one would be stale by the
time its sample is trained. Without a control block (`trainer.max_inflight_tasks` fixed and
`sync.mode=pause`) every rollout is admitted at once, as TRL does; the counts are kept either way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from agrpo.trainer.rollout.control import ControlBlock, samples_ahead

ADMIT_POLL_S = 0.005  # how often waiting rollouts look at the trainer's consumption


def worth_starting(served: int, published: int, max_staleness: int) -> bool:
    """Whether a rollout of the served version may still be trained: not while a version is loading that will make
    it too stale before the trainer's next batch (published counts only in background sync; 0 otherwise)."""
    return served >= published - max(max_staleness - 1, 0)


class Admission:
    def __init__(
        self, control_path: str | None, max_staleness: int, version: Callable[[], int], stopping: Callable[[], bool]
    ):
        self.control = ControlBlock.attach(control_path) if control_path else None
        self.max_staleness = max_staleness
        self.version = version
        self.stopping = stopping
        self.counts = {"admitted": 0, "finished": 0, "scored": 0, "produced": 0}
        self.waiting: deque[asyncio.Future] = deque()
        self.admitter: asyncio.Task | None = None

    async def admit(self) -> None:
        """Return once this rollout may start (in arrival order)."""
        if self.control is None or (not self.waiting and self.room()):
            self._count("admitted", 1)
            return
        ticket = asyncio.get_running_loop().create_future()
        self.waiting.append(ticket)
        if self.admitter is None or self.admitter.done():
            self.admitter = asyncio.create_task(self._admit_in_order())
        await ticket

    def finished(self) -> None:
        self._count("finished", 1)

    def scored(self, completions: int, samples: int) -> dict[str, float]:
        """Count a scored group; the pacing figures for the trainer's log."""
        self._count("scored", completions)
        self._count("produced", samples)
        figures = {"rollout/samples_generated_total": float(samples)}
        if self.control is not None:
            figures["rollout/samples_ahead"] = float(samples_ahead(self.snapshot()))
            figures["rollout/requests_in_flight"] = float(self.counts["admitted"] - self.counts["finished"])
        return figures

    def snapshot(self) -> dict[str, int]:
        return {**self.counts, "consumed": self.control.get("consumed")}

    def room(self) -> bool:
        if not worth_starting(self.version(), self.control.get("published"), self.max_staleness):
            return False
        budget = self.control.get("budget")
        return budget <= 0 or samples_ahead(self.snapshot()) < budget

    def _count(self, name: str, amount: int) -> None:
        self.counts[name] += amount
        if self.control is not None:
            self.control.set(name, self.counts[name])

    async def _admit_in_order(self) -> None:
        while self.waiting:
            stopping = self.stopping()  # stopping: the waiting rollouts are let go so the loop can end
            while self.waiting and (stopping or self.room()):
                ticket = self.waiting.popleft()
                if not ticket.done():  # a cancelled rollout takes no room
                    self._count("admitted", 1)
                    ticket.set_result(None)
            await asyncio.sleep(ADMIT_POLL_S)
