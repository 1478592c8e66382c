"""User code as a user writes it (a tools file and an environment file in a folder of their own), and TRL's real
rollout loop built around it without a server (its tool execution and environment probing need none)."""

from __future__ import annotations

import multiprocessing as mp
import textwrap
from pathlib import Path

import pytest

TOOLS_PY = '''
import asyncio
import time


def search(query: str, limit: int = 3) -> str:
    """Search the notes.

    Args:
        query: What to look for.
        limit: How many notes at most.
    """
    return f"{limit} notes about {query}"


async def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    await asyncio.sleep(0)
    return a + b


def broken(query: str) -> str:
    """Always fails.

    Args:
        query: Anything.
    """
    raise RuntimeError("the index is down")


def stuck(query: str) -> str:
    """Never answers.

    Args:
        query: Anything.
    """
    time.sleep(3600)
    return "late"


def opaque(query: str) -> object:
    """Returns something no message can carry.

    Args:
        query: Anything.
    """
    return {"when": object()}


def undocumented(query):
    return query
'''

ENV_PY = '''
class Counter:
    """Counts up; the reward is the count."""

    def __init__(self, start: int = 0):
        self.start = start
        self.count = start

    def reset(self, **row):
        if row.get("poison"):
            raise ValueError("poisoned row")
        self.count = self.start
        return f" (start at {self.start})"

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return self.count

    def wait(self, seconds: float) -> str:
        """Wait a while.

        Args:
            seconds: How long.
        """
        import time

        time.sleep(seconds)
        return "done"

    def get_reward(self) -> float:
        if self.count < 0:
            raise ValueError("a negative count has no reward")
        return float(self.count)


class Quiet:
    """An environment that scores nothing itself."""

    def reset(self, **row):
        return None

    def look(self) -> str:
        """Look around."""
        return "nothing"


class NoReset:
    def look(self) -> str:
        """Look around."""
        return "nothing"
'''


@pytest.fixture()
def user_code(tmp_path, monkeypatch) -> Path:
    """A folder with my_tools.py and my_env.py, as the working directory (so dotted paths work too)."""
    (tmp_path / "my_tools.py").write_text(textwrap.dedent(TOOLS_PY))
    (tmp_path / "my_env.py").write_text(textwrap.dedent(ENV_PY))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def reward_zero(completions, **columns):
    return [0.0 for _ in completions]


@pytest.fixture()
def rollout_loop():
    """TRL's own `_AsyncRolloutLoop` (or `cls`, a subclass), built with the given tools / environment_factory and other
    keyword arguments (no server is contacted)."""
    from datasets import Dataset
    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

    from agrpo.models.tiny import build_tokenizer

    made = []

    def build(cls=_AsyncRolloutLoop, **kwargs):
        ctx = mp.get_context("spawn")
        kwargs = {"max_inflight_tasks": 4, **kwargs}
        loop = cls(
            model_name="tiny",
            dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "hi"}]]}),
            reward_funcs=[reward_zero],
            processing_class=build_tokenizer(),
            eos_token_ids=[0],
            rollout_buffer=ctx.Queue(),
            model_version_value=ctx.Value("i", 0),
            heartbeat_value=ctx.Value("d", 0.0),
            failed_event=ctx.Event(),
            exception_info_queue=ctx.Queue(),
            metrics_queue=ctx.Queue(),
            **kwargs,
        )
        made.append(loop)
        return loop

    yield build
    for loop in made:
        loop._tool_pool.shutdown(wait=False, cancel_futures=True)
        loop._loop.close()
