"""Environments from config as TRL takes them (agrpo/agents/environments.py): what agrpo's rollout loop finds in
them (agrpo/trainer/rollout/toolbox.py, under TRL's contract), the pickle trip into a spawned process, guarded tool methods, and a reset or get_reward that raises."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from transformers.utils import get_json_schema

from agrpo.agents.environments import EnvironmentFactory, EnvironmentFailed, build_environment
from agrpo.agents.tools import ToolTimeout, load_target
from agrpo.errors import ConfigError


def play(factory):
    """Runs in a spawned process, as TRL's rollout worker does: make, reset, use a tool, score."""
    env = factory()
    env.reset(prompt="p")
    return type(env).__name__, env.increment(by=4), env.get_reward()


def test_the_instance_is_the_users_class_with_the_same_tools(user_code):
    env = EnvironmentFactory("my_env.py:Counter", {"start": 2})()
    counter = load_target("my_env.py:Counter")
    assert isinstance(env, counter) and type(env).__name__ == "Counter"
    assert env.reset(prompt="p") == " (start at 2)"
    assert env.increment(by=3) == 5 and env.get_reward() == 5.0
    own = get_json_schema(counter(2).increment)
    own["function"].pop("return", None)  # the return is left out of served schemas (agrpo/agents/tools.py)
    assert get_json_schema(env.increment) == own


def test_a_factory_survives_a_spawned_process(user_code):
    factory = EnvironmentFactory("my_env.py:Counter", {"start": 1})
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(play, (factory,)) == ("Counter", 5, 5.0)


def test_the_rollout_loop_finds_the_tools_and_the_reward(user_code, rollout_loop):
    """The loop probes one instance per environment (as TRL does): its public methods are the tools, get_reward a
    reward column."""
    factories = build_environment({"a": "my_env.py:Counter", "b": {"_target_": "my_env.py:Counter", "start": 3}}, 5)
    loop = rollout_loop(environment_factory=factories)
    assert {name: [t.__name__ for t in tools] for name, tools in loop.toolbox.offered.items()} == {
        "a": ["increment", "wait"],
        "b": ["increment", "wait"],
    }
    assert loop.scorer.names == ["reward_zero", "Counter"]


def test_a_tool_method_that_hangs_times_out(user_code):
    env = EnvironmentFactory("my_env.py:Counter", timeout_s=0.3)()
    with pytest.raises(ToolTimeout, match="wait did not return within 0.3 s"):
        env.wait(seconds=30)
    assert env.wait(seconds=0) == "done"


def test_a_reset_that_raises_is_reported_with_its_row(user_code):
    env = EnvironmentFactory("my_env.py:Counter")()
    with pytest.raises(EnvironmentFailed) as raised:
        env.reset(prompt=[{"role": "user", "content": "count"}], poison=True, answer=3)
    message = str(raised.value)
    assert message.startswith("environment Counter.reset raised on the row {prompt=")
    assert "poison=True" in message and "answer=3" in message and "ValueError: poisoned row" in message


def test_a_get_reward_that_raises_names_the_row_of_its_reset(user_code):
    env = EnvironmentFactory("my_env.py:Counter")()
    env.reset(prompt="p", answer=7)
    env.increment(by=-1)
    with pytest.raises(EnvironmentFailed, match=r"Counter.get_reward raised after the row \{prompt='p', answer=7\}"):
        env.get_reward()


def test_bad_environment_entries_name_their_key(user_code):
    with pytest.raises(ConfigError, match=r"agent.environment.b='nowhere.py:Env' cannot be loaded"):
        build_environment({"a": "my_env.py:Counter", "b": "nowhere.py:Env"}, timeout_s=None)
    with pytest.raises(ConfigError, match="agent.environment must be"):
        build_environment([1, 2], timeout_s=None)
    assert build_environment(None, timeout_s=None) is None


SLOW_ENV = '''
import asyncio
import time


class Slow:
    def reset(self, **row):
        time.sleep(row.get("sleep", 0))

    def look(self) -> str:
        """Look around."""
        return "a long corridor " * 1000

    def get_reward(self) -> float:
        time.sleep(3600)
        return 1.0


class AsyncReward:
    def reset(self, **row):
        self.sleep = row.get("sleep", 0)

    async def get_reward(self) -> float:
        await asyncio.sleep(self.sleep)
        return 0.5
'''


def test_a_hung_reset_or_get_reward_stops_at_the_timeout_naming_the_row(user_code):
    """TRL gives `reset` and `get_reward` no time limit: a hung one stalled the run without a word (issue 32). They
    run under agent.tool_timeout_s, and the failure names the environment and the row, as a raising one does."""
    (user_code / "slow_env.py").write_text(SLOW_ENV)
    env = EnvironmentFactory("slow_env.py:Slow", timeout_s=0.3)()
    with pytest.raises(EnvironmentFailed, match=r"Slow.reset raised on the row \{sleep=30\}: ToolTimeout: .*0.3 s"):
        env.reset(sleep=30)
    env.reset(sleep=0, answer=2)
    with pytest.raises(EnvironmentFailed, match=r"Slow.get_reward raised after the row \{sleep=0, answer=2\}"):
        env.get_reward()


def test_an_async_get_reward_stays_awaitable_and_is_bounded_too(user_code):
    import asyncio
    import inspect

    (user_code / "slow_env.py").write_text(SLOW_ENV)
    env = EnvironmentFactory("slow_env.py:AsyncReward", timeout_s=0.3)()
    assert inspect.iscoroutinefunction(env.get_reward)  # TRL awaits it rather than running it in a thread
    env.reset(sleep=0)
    assert asyncio.run(env.get_reward()) == 0.5
    env.reset(sleep=30)
    with pytest.raises(EnvironmentFailed, match=r"AsyncReward.get_reward raised after the row .*within 0.3 s"):
        asyncio.run(env.get_reward())


def test_an_environments_tool_answer_is_capped(user_code):
    (user_code / "slow_env.py").write_text(SLOW_ENV)
    env = EnvironmentFactory("slow_env.py:Slow", max_output_chars=100)()
    answer = env.look()
    assert answer.startswith("a long corridor") and answer.endswith("(agent.max_tool_output_chars=100)]")
    assert "[... 15900 more characters cut by agrpo" in answer
