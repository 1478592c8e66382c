"""Tools and environments for episodes (agrpo/trainer/rollout/toolbox.py), under TRL's documented contract: a
`{name: factory}` mapping picks an environment per row, instances are pooled (built once, reset per episode), what
`reset` returns is appended to the prompt's last message, an environment with `get_reward` is a reward column, and
tool calls answer in order with unknown names and raising tools counted as failures."""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import ThreadPoolExecutor

import pytest

from agrpo.trainer.rollout.figures import Figures
from agrpo.trainer.rollout.toolbox import Toolbox, with_observation


class Dice:
    built = 0

    def __init__(self):
        Dice.built += 1
        self.rolled = 0

    def reset(self, **row):
        self.rolled = 0
        return f" (sides {row['sides']})"

    def roll(self, times: int) -> int:
        """Roll.

        Args:
            times: How often.
        """
        self.rolled += times
        return self.rolled

    def get_reward(self) -> float:
        return float(self.rolled)


class Coin:
    def reset(self, **row):
        return None

    def flip(self) -> str:
        """Flip."""
        return "heads"


def broken(query: str) -> str:
    """Fails.

    Args:
        query: Anything.
    """
    raise RuntimeError("down")


@pytest.fixture
def toolbox():
    pool = ThreadPoolExecutor(2)
    yield Toolbox([broken], {"dice": Dice, "coin": Coin}, pool, Figures(queue.Queue()))
    pool.shutdown(wait=False)


def test_each_row_gets_its_environment_from_the_pool_reset_for_it(toolbox):
    probed = Dice.built  # the toolbox built one to probe its tools; it seeds the pool
    row = {"environment": "dice", "sides": 6, "prompt": [{"role": "user", "content": "roll"}]}
    assert toolbox.environment_name(row) == "dice"
    assert [t.__name__ for t in toolbox.schema_tools("dice")] == ["broken", "roll"]
    assert [t.__name__ for t in toolbox.schema_tools("coin")] == ["broken", "flip"]
    assert toolbox.reward_classes == [Dice] and toolbox.any_tools

    async def scenario():
        dice, observation = await toolbox.draw("dice", row)
        assert observation == " (sides 6)" and Dice.built == probed  # the probe instance, reused
        answers, made, failed = await toolbox.call(
            [
                {"function": {"name": "roll", "arguments": {"times": 3}}},
                {"function": {"name": "nope", "arguments": {}}},
                {"function": {"name": "broken", "arguments": {"query": "x"}}},
            ],
            toolbox.callable_tools(dice),
        )
        assert [a["content"] for a in answers] == ["3", "{'error': 'unknown tool nope'}", "{'error': 'down'}"]
        assert (made, failed) == (3, 2)
        assert await toolbox.reward(dice) == (Dice, 3.0)
        toolbox.give_back("dice", dice)
        again, _ = await toolbox.draw("dice", row)
        assert again is dice and again.rolled == 0 and Dice.built == probed  # reset, not rebuilt

    asyncio.run(scenario())
    counters = toolbox.figures.counters
    assert counters["tools/unknown_name_total"] == 1 and counters["tools/broken/failure_total"] == 1
    assert counters["tools/roll/call_total"] == 1 and toolbox.figures.rates["tools/parallel_calls_mean"] == [3, 1]


def test_a_row_naming_no_environment_of_the_run_is_refused_with_the_names(toolbox):
    with pytest.raises(
        ValueError, match="environment='cards', which is none of the run's environments .'dice', 'coin'"
    ):
        toolbox.environment_name({"environment": "cards"})


def test_the_observation_goes_onto_the_last_message_in_a_new_list():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert with_observation(prompt, " more")[-1]["content"] == "u more" and prompt[-1]["content"] == "u"
    assert with_observation(prompt, None) is prompt
    listed = with_observation(prompt, [{"type": "image"}])[-1]["content"]
    assert listed == [{"type": "text", "text": "u"}, {"type": "image"}]
