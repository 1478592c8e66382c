"""What an episode can call: the run's tools and its environments (`agent.tools`, `agent.environment`), under the
contract TRL 1.16 documents for `AsyncGRPOTrainer(tools=..., environment_factory=...)`, so a user's tools file and
environment class work the same with TRL's own rollout worker and agrpo's.

- An environment factory is one callable or a `{name: factory}` mapping (a row then picks its environment by its
  `environment` field). Instances are pooled: built once, `reset(**row)` before each episode (what it returns is
  appended to the row's last prompt message), handed back to the pool after the episode.
- The model is offered an environment's public methods other than `reset` and `get_reward`, next to the run's tools.
- An environment class with `get_reward` is one more reward column, named after the class, scored when its episode
  ends (while the instance holds the episode's state).
- A tool call runs a sync tool in a thread pool (a slow tool never blocks the event loop) and awaits an async one;
  an unknown name or a raising tool answers `{'error': ...}` and counts as a failure. Figures under TRL's names.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agrpo.agents.environments import tool_methods
from agrpo.trainer.rollout.figures import Figures


def offered_methods(instance: Any) -> list[Callable]:
    """The bound methods of `instance` the model may call (the names agents/environments.py's `tool_methods` gives,
    which the validation pass and `agrpo eval` use too)."""
    return [getattr(instance, name) for name in tool_methods(type(instance))]


def with_observation(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """The prompt with what `reset` returned appended to its last message (a new list: rows are shared)."""
    if observation is None:
        return prompt
    last = prompt[-1]
    content = last["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**last, "content": content + observation}]


class Toolbox:
    """The run's tools and environment pools, for every episode of the child."""

    def __init__(
        self, tools: list[Callable] | None, environment_factory: Any, pool: ThreadPoolExecutor, figures: Figures
    ):
        self.tools = list(tools or [])
        self.pool = pool
        self.figures = figures
        self.multi = isinstance(environment_factory, dict)
        if environment_factory is None:
            self.factories: dict[Any, Callable] = {}
        else:
            self.factories = environment_factory if self.multi else {None: environment_factory}
        self.idle: dict[Any, list[Any]] = {}
        self.offered: dict[Any, list[Callable]] = {}  # per environment: the tools its prompts show
        self.reward_classes: list[type] = []  # environment classes with get_reward, in column order
        for name, factory in self.factories.items():
            probe = factory()  # seeds the pool
            members = dict(inspect.getmembers(type(probe), predicate=inspect.isfunction))
            if "reset" not in members:
                raise ValueError(
                    f"the environment {type(probe).__name__} has no `reset` method: each episode starts with "
                    "`reset(**row)`, so the environment class must define one"
                )
            if "get_reward" in members and type(probe) not in self.reward_classes:
                self.reward_classes.append(type(probe))
            self.offered[name] = self.tools + offered_methods(probe)
            self.idle[name] = [probe]

    @property
    def any_tools(self) -> bool:
        """Whether episodes can call anything (then the chat template must keep prefixes, and tool figures count)."""
        return bool(self.tools) or any(self.offered.values())

    def all_tools(self) -> list[Callable]:
        """Every tool any prompt shows (to pick the chat template)."""
        found = list(self.tools)
        for methods in self.offered.values():
            found += [m for m in methods if m not in found]
        return found

    def environment_name(self, row: dict[str, Any]) -> Any:
        if not self.multi:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"a row names environment={name!r}, which is none of the run's environments "
                f"({', '.join(map(repr, self.factories))})"
            )
        return name

    async def draw(self, name: Any, row: dict[str, Any]) -> tuple[Any, Any]:
        """(an environment instance reset for `row`, what reset returned); (None, None) without environments."""
        if not self.factories:
            return None, None
        idle = self.idle[name]
        environment = idle.pop() if idle else self.factories[name]()
        fields = {k: v for k, v in row.items() if k != "environment"} if self.multi else row
        started = time.monotonic()
        try:
            observation = await self._call(environment.reset, fields)
        except BaseException:
            idle.append(environment)
            raise
        self.figures.rate("env/reset_s", time.monotonic() - started)
        return environment, observation

    def give_back(self, name: Any, environment: Any) -> None:
        if environment is not None:
            self.idle[name].append(environment)

    def schema_tools(self, name: Any) -> list[Callable]:
        return self.offered[name] if self.factories else self.tools

    def callable_tools(self, environment: Any) -> dict[str, Callable]:
        methods = offered_methods(environment) if environment is not None else []
        return {tool.__name__: tool for tool in self.tools + methods}

    async def reward(self, environment: Any) -> tuple[type, float] | None:
        """(its class, its reward) for an environment that scores itself; None otherwise."""
        if environment is None or type(environment) not in self.reward_classes:
            return None
        started = time.monotonic()
        value = await self._call(environment.get_reward, {})
        self.figures.rate("env/reward_s", time.monotonic() - started)
        return type(environment), value

    async def call(self, calls: list[dict[str, Any]], tools: dict[str, Callable]) -> tuple[list[dict], int, int]:
        """The tool messages answering one reply's calls (in order), the calls made and how many failed."""
        messages, failures = [], 0
        for call in calls:
            function = call["function"]
            name = function["name"]
            self.figures.count(f"tools/{name}/call_total")
            tool = tools.get(name)
            if tool is None:  # a hallucinated name: the policy's error, apart from a tool that raised
                failures += 1
                self.figures.count("tools/unknown_name_total")
                self.figures.count(f"tools/{name}/failure_total")
                messages.append({"role": "tool", "name": name, "content": str({"error": f"unknown tool {name}"})})
                continue
            started = time.monotonic()
            try:
                result = await self._call(tool, function.get("arguments", {}))
            except Exception as error:
                failures += 1
                self.figures.count(f"tools/{name}/failure_total")
                result = {"error": str(error)}
            elapsed = time.monotonic() - started
            self.figures.rate("tools/latency_s", elapsed)
            self.figures.rate(f"tools/{name}/latency_s", elapsed)
            messages.append({"role": "tool", "name": name, "content": str(result)})
        self.figures.rate("tools/parallel_calls_mean", len(calls))
        return messages, len(calls), failures

    async def _call(self, function: Callable, arguments: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(function):
            return await function(**arguments)
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(function, **arguments))
