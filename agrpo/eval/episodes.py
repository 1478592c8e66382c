"""`agrpo eval` for agents: k episodes per problem with the training run's tools and environments.

An episode is played as agrpo's rollout loop plays it in training (agrpo/trainer/rollout/episode.py, `Episodes.play`, on
the rules TRL 1.16's rollout worker defines): the environment is reset with the row and what `reset` returns is appended
to the last prompt message; then, turn after turn, the whole conversation is rendered with the tools, one completion is
sampled through the same `/v1/completions` path, TRL's `parse_response` reads tool calls from it, each call runs
(guarded as in training) and its answer goes back as a `tool` message, until a turn calls no tool or
`agent.max_tool_calling_iterations` is reached. Rewards receive each episode's completion as its messages (what the
rollout loop passes them in training, TRL's convention); an environment with `get_reward` adds its column, named after
its class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agrpo.agents.build import Agent
from agrpo.config.schema import RunConfig
from agrpo.agents.environments import tool_methods
from agrpo.eval.scoring import ProblemResult, is_correct, problem_of, total_rewards
from agrpo.rewards.contract import call_reward

TURN_SEED_STRIDE = 1_000_003  # turn t of an episode samples with seed + t * stride: fixed draws, distinct per turn


@dataclass
class Episode:
    """One played episode: its completion messages and token ids, tool use, and the environment's reward."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    exhausted: bool = False  # stopped by max_tool_calling_iterations while the model still called a tool
    truncated: bool = False  # the last turn was cut at max_tokens
    environment: str | None = None  # the class that scored it, when it has get_reward
    environment_reward: float | None = None


def run_tool_calls(tool_calls: list[dict[str, Any]], tools: dict[str, Callable]) -> tuple[list[dict], int]:
    """The tool messages for one turn's calls and how many failed: TRL's rules (an unknown name or an exception
    becomes `{'error': ...}` as the tool's answer; anything else its str)."""
    messages, failures = [], 0
    for call in tool_calls:
        function = call["function"]
        name = function["name"]
        tool = tools.get(name)
        if tool is None:
            failures += 1
            messages.append({"role": "tool", "name": name, "content": str({"error": f"unknown tool {name}"})})
            continue
        try:
            result = tool(**(function.get("arguments") or {}))
        except Exception as error:  # the model sees the error, as in training
            failures += 1
            result = {"error": str(error)}
        messages.append({"role": "tool", "name": name, "content": str(result)})
    return messages, failures


def folded_prompt(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """The prompt with an environment's reset observation appended to its last message (as TRL does)."""
    if observation is None:
        return list(prompt)
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": str(last["content"]) + str(observation)}]


class AgentEpisodes:
    """Plays and scores agent episodes for `agrpo eval` (agrpo/eval/runner.py)."""

    def __init__(
        self, agent: Agent, tokenizer: Any, params: dict[str, Any], template_kwargs: dict[str, Any] | None = None
    ):
        from agrpo.models.chat_template import TurnRenderer, response_ready

        self.agent, self.params = agent, params
        self.tokenizer = response_ready(tokenizer)
        classes = agent.environment_classes().values()
        any_tools = bool(agent.tools) or any(tool_methods(cls) for cls in classes)  # training's Toolbox.any_tools
        self.render = TurnRenderer(self.tokenizer, template_kwargs, keep_prefix=any_tools)
        self.factories = agent.factories()
        self.reward_names = agent.reward_names()

    def sample(self, endpoint: Any, model: str, row: dict[str, Any], k: int, seed: int) -> list[Episode]:
        """k episodes of one problem through `endpoint` (agrpo.eval.runner.Endpoint), episode j seeded seed + j."""

        def complete(prompt_ids: list[int], turn_seed: int) -> dict:
            return endpoint.complete(model, prompt_ids, 1, turn_seed, self.params)[0]

        return [self.play(complete, row, seed + j) for j in range(k)]

    def summary(self, outputs: list[list[Episode]]) -> dict[str, float]:
        return episode_summary([episode for episodes in outputs for episode in episodes])

    def play(self, complete: Callable[[list[int], int], dict], row: dict[str, Any], seed: int) -> Episode:
        """One episode of `row`; `complete(prompt_ids, seed)` returns vLLM's choice (token_ids, finish_reason)."""
        from trl.chat_template_utils import parse_response

        episode = Episode()
        environment, prompt = self._reset(row, episode)
        methods = [getattr(environment, name) for name in tool_methods(type(environment))] if environment else []
        tools = [tool.method for tool in self.agent.tools] + methods
        by_name = {tool.__name__: tool for tool in tools}
        messages = list(prompt)
        limit = self.agent.max_tool_calling_iterations
        while True:
            prompt_ids = self.render(messages, tools)
            choice = complete(prompt_ids, seed + episode.turns * TURN_SEED_STRIDE)
            turn_ids = list(choice.get("token_ids") or [])
            reply = parse_response(self.tokenizer, turn_ids, prefix=prompt_ids, tools=tools)
            episode.turns += 1
            episode.token_ids += turn_ids
            episode.truncated = choice.get("finish_reason") == "length"
            episode.messages.append(reply)
            messages.append(reply)
            calls = reply.get("tool_calls")
            if calls is None:
                break
            if limit is not None and episode.turns > limit:
                episode.exhausted = True
                break
            answers, failures = run_tool_calls(calls, by_name)
            episode.tool_calls += len(calls)
            episode.tool_failures += failures
            episode.messages += answers
            messages += answers
        if environment is not None and type(environment).__name__ in self.reward_names:
            episode.environment = type(environment).__name__
            episode.environment_reward = float(environment.get_reward())
        return episode

    def _reset(self, row: dict[str, Any], episode: Episode) -> tuple[Any, list[dict[str, Any]]]:
        """(a fresh environment reset with the row, or None; the prompt with its observation folded in)."""
        if not self.factories:
            return None, list(row["prompt"])
        multi = None not in self.factories
        factory = self.factories[row["environment"] if multi else None]
        environment = factory()
        observation = environment.reset(**{k: v for k, v in row.items() if not (multi and k == "environment")})
        return environment, folded_prompt(row.get("prompt") or [{"role": "user", "content": ""}], observation)

    def score(
        self,
        index: int,
        row: dict[str, Any],
        episodes: list[Episode],
        rewards: list[Any],
        names: list[str],
        cfg: RunConfig,
    ) -> ProblemResult:
        """One problem's episodes scored with every reward term, then each environment's reward column."""
        n = len(episodes)
        columns = {key: [value] * n for key, value in row.items() if key != "prompt"}
        completions = [e.messages for e in episodes]
        kwargs = dict(
            completions=completions, prompts=[row.get("prompt")] * n, completion_ids=[e.token_ids for e in episodes]
        )
        # As in training and single-turn eval: a failing term is one RewardError paragraph (rewards/contract.py).
        raw = [call_reward(reward.func, name, {**kwargs, **columns}) for reward, name in zip(rewards, names)]
        weighted = [[None if s is None else r.weight * float(s) for s in scores] for r, scores in zip(rewards, raw)]
        for name in self.reward_names:
            column = [e.environment_reward if e.environment == name else None for e in episodes]
            raw.append(column)
            weighted.append(column)
        deciding = raw[cfg.eval.correct_term]
        return ProblemResult(
            index=index,
            problem=problem_of({**row, "prompt": row.get("prompt") or []}),
            answer=str(row.get("answer", "")),
            completions=[transcript(e.messages) for e in episodes],
            rewards=total_rewards(weighted),
            term_scores=dict(zip(names, raw)),
            correct=[is_correct(s, cfg.eval.correct_threshold) for s in deciding],
            truncated=[e.truncated for e in episodes],
            completion_tokens=[len(e.token_ids) for e in episodes],
        )


def transcript(messages: list[dict[str, Any]]) -> str:
    """An episode as one text for the per-problem record: each turn on its own line, tool calls spelled out."""
    lines = []
    for message in messages:
        calls = "".join(
            f" -> {c['function']['name']}({c['function'].get('arguments') or {}})"
            for c in message.get("tool_calls") or []
        )
        lines.append(f"[{message.get('role')}] {message.get('content') or ''}{calls}")
    return "\n".join(lines)


def episode_summary(episodes: list[Episode]) -> dict[str, float]:
    """Tool use over every episode of an evaluation (the figures training logs under tools/* and agent/*)."""
    if not episodes:
        return {}
    calls = sum(e.tool_calls for e in episodes)
    return {
        "episodes": len(episodes),
        "turns_per_episode": sum(e.turns for e in episodes) / len(episodes),
        "tool_calls_per_episode": calls / len(episodes),
        "tool_failure_share": sum(e.tool_failures for e in episodes) / calls if calls else 0.0,
        "tool_loop_exhausted_share": sum(e.exhausted for e in episodes) / len(episodes),
    }
