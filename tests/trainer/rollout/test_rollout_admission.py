"""The paced rollout loop's overrides (agrpo/trainer/rollout_child.py) on a stand-in for TRL's loop: the same three
methods it overrides, the same call pattern (a rollout asks for `_request_model` once per turn, its rows carry the
rollout id, a group is scored into one sample per row), with real asyncio and a real shared control block."""

import asyncio
import itertools
from dataclasses import dataclass, field

import pytest

from agrpo.trainer.rollout_child import PacingMixin
from agrpo.trainer.rollout.control import ControlBlock, samples_ahead


@dataclass
class Row:
    rollout_id: str


@dataclass
class Sample:
    model_version: int


@dataclass
class Group:
    group_id: int
    model_version: int
    completions: list = field(default_factory=list)
    completions_sequences: list = field(default_factory=list)


class TrlLikeLoop:
    """What PacingMixin relies on from TRL's `_AsyncRolloutLoop`."""

    ids = itertools.count()

    def __init__(self, **kwargs):
        self.lora_name, self.model_name = "trl-policy", "base"
        self.served = 1
        self.turns = 1
        self.release = asyncio.Event()
        self.asked: list[str] = []
        self.pushed: list[dict] = []
        self.stop_event = asyncio.Event()

    @property
    def model_version(self) -> int:
        return self.served

    async def _generate_one(self, prompt, tool_dict, tools, group_id=0):
        for _ in range(self.turns):
            self.asked.append(self._request_model)
            await self.release.wait()
        return ["completion"], [1, 2], [Row(f"r{next(self.ids)}")], 0, 0, None

    async def _score_group(self, group):
        return [Sample(group.model_version) for _ in itertools.chain.from_iterable(group.completions_sequences)]

    def push_figures(self, values):
        self.pushed.append(values)


class Loop(PacingMixin, TrlLikeLoop):
    pass


def run(coro):
    return asyncio.run(coro)


async def until(predicate, timeout_s=10.0):
    """Wait for something that must happen (a fixed sleep only where something must NOT happen)."""

    async def poll():
        while not predicate():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


def test_each_sample_carries_the_version_its_rollout_asked_for():
    async def scenario():
        loop = Loop(agrpo_max_staleness=1)
        loop.release.set()
        group = Group(group_id=0, model_version=1)  # TRL labels the group when it is created: v1
        results = [await loop._generate_one("p", {}, [], group_id=0)]
        loop.served = 2  # v2 is served while the group is still being generated
        results += [await loop._generate_one("p", {}, [], group_id=0) for _ in range(2)]
        for result in results:
            group.completions.append(result[0])
            group.completions_sequences.append(result[2])
        samples = await loop._score_group(group)
        assert [s.model_version for s in samples] == [1, 2, 2]  # TRL would have said [1, 1, 1]
        assert loop.asked == ["trl-policy-v1", "trl-policy-v2", "trl-policy-v2"]
        assert loop.pushed[-1]["rollout/samples_generated_total"] == 3.0

    run(scenario())


def test_a_conversation_of_several_turns_is_labelled_with_its_oldest_version():
    async def scenario():
        loop = Loop(agrpo_max_staleness=1)
        loop.turns = 2
        task = asyncio.create_task(loop._generate_one("p", {}, [], group_id=0))
        await until(lambda: loop.asked)
        loop.served = 2  # the second turn asks for v2
        loop.release.set()
        result = await task
        group = Group(0, 2, [result[0]], [result[2]])
        assert loop.asked == ["trl-policy-v1", "trl-policy-v2"]
        assert [s.model_version for s in await loop._score_group(group)] == [1]

    run(scenario())


@pytest.fixture
def block():
    shared = ControlBlock.create()
    yield shared
    shared.close()


def test_rollouts_start_only_while_the_samples_ahead_are_under_the_budget(block):
    async def scenario():
        block.set("budget", 3)
        loop = Loop(agrpo_control=block.path, agrpo_max_staleness=1)
        tasks = [asyncio.create_task(loop._generate_one("p", {}, [], group_id=i // 2)) for i in range(6)]
        await until(lambda: len(loop.asked) == 3)
        await asyncio.sleep(0.05)
        assert len(loop.asked) == 3  # three started, three wait
        loop.release.set()
        await until(lambda: block.get("finished") == 3)
        await asyncio.sleep(0.05)
        # the three are done but not scored nor taken by the trainer: still ahead, nothing new starts
        assert len(loop.asked) == 3 and block.get("finished") == 3
        group = Group(0, 1, [["c"]] * 2, [[Row("x")], [Row("y")]])
        await loop._score_group(group)  # two rollouts scored into two samples on the queue: still ahead
        await asyncio.sleep(0.05)
        assert len(loop.asked) == 3
        block.set("consumed", 2)  # the trainer took them: two more may start
        await until(lambda: len(loop.asked) == 5)
        await asyncio.sleep(0.05)
        assert len(loop.asked) == 5
        assert loop.pushed[-1]["rollout/samples_ahead"] == 3.0  # when the group was scored
        assert samples_ahead(block.snapshot()) == 3  # (5 started - 2 scored) + (2 produced - 2 taken): the budget
        loop.stop_event.set()  # stopping: the last one is let go so TRL's loop can finish
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        assert len(loop.asked) == 6

    run(scenario())


def test_no_rollout_starts_while_the_version_it_would_use_is_already_too_old(block):
    async def scenario():
        block.set("budget", 10)
        block.set("published", 2)  # v2 is published and loading; v1 is served
        loop = Loop(agrpo_control=block.path, agrpo_max_staleness=1)
        loop.release.set()
        task = asyncio.create_task(loop._generate_one("p", {}, [], group_id=0))
        await asyncio.sleep(0.05)
        assert loop.asked == []  # a v1 sample would be two versions old by the trainer's next batch
        loop.served = 2
        await asyncio.wait_for(task, 2)
        assert loop.asked == ["trl-policy-v2"]

    run(scenario())
