"""When a rollout may start (agrpo/trainer/rollout/admission.py), with real asyncio and a real shared control block:
under the trainer's budget of samples ahead, in arrival order, and not while the served version is already too old
for the trainer's next batch. Rollouts here are tasks doing what the loop's `_rollout` does around its episode:
`admit()`, the episode (waiting on `release`), `finished()`; a scored group is `scored(completions, samples)`."""

import asyncio

import pytest

from agrpo.trainer.rollout.admission import Admission, worth_starting
from agrpo.trainer.rollout.control import ControlBlock, samples_ahead


class Rollouts:
    def __init__(self, admission: Admission):
        self.admission = admission
        self.started: list[int] = []
        self.release = asyncio.Event()

    async def one(self, index: int) -> None:
        await self.admission.admit()
        self.started.append(index)
        await self.release.wait()
        self.admission.finished()


async def until(predicate, timeout_s=10.0):
    """Wait for something that must happen (a fixed sleep only where something must NOT happen)."""

    async def poll():
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


@pytest.fixture
def block():
    shared = ControlBlock.create()
    yield shared
    shared.close()


def test_without_a_control_block_every_rollout_starts_at_once_and_is_counted():
    async def scenario():
        admission = Admission(None, 1, lambda: 1, lambda: False)
        rollouts = Rollouts(admission)
        tasks = [asyncio.create_task(rollouts.one(i)) for i in range(5)]
        await until(lambda: len(rollouts.started) == 5)
        rollouts.release.set()
        await asyncio.gather(*tasks)
        assert admission.counts == {"admitted": 5, "finished": 5, "scored": 0, "produced": 0}
        assert admission.scored(5, 7) == {"rollout/samples_generated_total": 7.0}  # no pacing figures

    asyncio.run(scenario())


def test_rollouts_start_only_while_the_samples_ahead_are_under_the_budget_in_arrival_order(block):
    async def scenario():
        block.set("budget", 3)
        stopping = False
        admission = Admission(block.path, 1, lambda: 1, lambda: stopping)
        rollouts = Rollouts(admission)
        tasks = [asyncio.create_task(rollouts.one(i)) for i in range(6)]
        await until(lambda: len(rollouts.started) == 3)
        await asyncio.sleep(0.05)
        assert rollouts.started == [0, 1, 2]  # three started, three wait
        rollouts.release.set()
        await until(lambda: block.get("finished") == 3)
        await asyncio.sleep(0.05)
        # the three are done but not scored nor taken by the trainer: still ahead, nothing new starts
        assert len(rollouts.started) == 3
        figures = admission.scored(2, 2)  # two rollouts scored into two samples on the queue: still ahead
        await asyncio.sleep(0.05)
        assert len(rollouts.started) == 3 and figures["rollout/samples_ahead"] == 3.0
        assert figures["rollout/requests_in_flight"] == 0.0
        block.set("consumed", 2)  # the trainer took them: two more may start, the next in line first
        await until(lambda: len(rollouts.started) == 5)
        await asyncio.sleep(0.05)
        assert rollouts.started == [0, 1, 2, 3, 4]
        assert samples_ahead(block.snapshot()) == 3  # (5 started - 2 scored) + (2 produced - 2 taken): the budget
        stopping = True  # stopping: the last one is let go so the loop can end
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        assert len(rollouts.started) == 6

    asyncio.run(scenario())


def test_no_rollout_starts_while_the_version_it_would_use_is_already_too_old(block):
    async def scenario():
        block.set("budget", 10)
        block.set("published", 2)  # v2 is published and loading; v1 is served
        served = [1]
        admission = Admission(block.path, 1, lambda: served[0], lambda: False)
        rollouts = Rollouts(admission)
        rollouts.release.set()
        task = asyncio.create_task(rollouts.one(0))
        await asyncio.sleep(0.05)
        assert rollouts.started == []  # a v1 sample would be two versions old by the trainer's next batch
        served[0] = 2
        await asyncio.wait_for(task, 2)
        assert rollouts.started == [0]

    asyncio.run(scenario())


def test_a_cancelled_waiting_rollout_takes_no_room(block):
    async def scenario():
        block.set("budget", 1)
        admission = Admission(block.path, 1, lambda: 1, lambda: False)
        rollouts = Rollouts(admission)
        first = asyncio.create_task(rollouts.one(0))
        waiting = asyncio.create_task(rollouts.one(1))
        await until(lambda: rollouts.started == [0])
        waiting.cancel()
        rollouts.release.set()
        await first
        admission.scored(1, 1)
        block.set("consumed", 1)
        third = asyncio.create_task(rollouts.one(2))
        await asyncio.wait_for(third, 2)
        assert rollouts.started == [0, 2] and admission.counts["admitted"] == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("served", "published", "staleness", "expected"),
    [(1, 2, 1, False), (1, 2, 2, True), (2, 2, 1, True), (5, 0, 1, True)],
)
def test_worth_starting(served, published, staleness, expected):
    assert worth_starting(served, published, staleness) is expected
