"""User code as a user writes it (a tools file and an environment file in a folder of their own), and agrpo's rollout
loop (agrpo/trainer/rollout/loop.py) built around it on a child's channels without a server: its toolbox (tools,
environments) and its episodes are the parts the tests drive; nothing is contacted until a test opens its client."""

from __future__ import annotations

import multiprocessing as mp
import queue
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
    """agrpo's `RolloutLoop`, built as the rollout child builds it (on `ChildChannels`, with the tiny tokenizer), with
    the given tools / environment_factory and other settings; its figures go to a plain queue the test reads
    (`counted`). No server is contacted: a test opens `loop.client` itself around what it plays."""
    from datasets import Dataset

    from agrpo.models.tiny import build_tokenizer
    from agrpo.trainer.rollout.loop import RolloutLoop
    from agrpo.trainer.rollout.process import ChildChannels

    made = []

    def build(**settings):
        settings = {
            "model_name": "tiny",
            "dataset": Dataset.from_dict({"prompt": [[{"role": "user", "content": "hi"}]]}),
            "reward_funcs": [reward_zero],
            "processing_class": build_tokenizer(),
            "eos_token_ids": [0],
            "vllm_server_url": "http://127.0.0.1:9",
            "max_inflight_tasks": 4,
            **settings,
        }
        loop = RolloutLoop(ChildChannels.create(mp.get_context("spawn"), queue_maxsize=0), **settings)
        loop.figures.sink = queue.Queue()  # read in this process: no pipe to wait on
        made.append(loop)
        return loop

    yield build
    for loop in made:
        loop.pool.shutdown(wait=False, cancel_futures=True)
