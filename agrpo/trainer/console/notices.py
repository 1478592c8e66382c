"""One console line, once, when a run's figures say it is not learning or an episode was cut short; pure.

Issue 32: a user's tool task trained 192 episodes at reward 0.000 +- 0.000 with not one tool call, and nothing said
so; a tool answer too long for the context stalled the run without a word. `RunNotices.observe` reads each step's
logged figures (TRL's, and those agrpo's rollout loop adds: agrpo/trainer/rollout/episode.py, scorer.py) and
returns the lines to print, each at most once per run (a later turn refused by vLLM is said by the rollout child
itself, at once, with vLLM's words: agrpo/trainer/rollout/episode.py):

- the reward had no spread within any group for `NO_SIGNAL_STEPS` steps in a row: GRPO's advantages were all 0;
- an agent run called no tool in its first `NO_SIGNAL_STEPS` steps: the model does not write calls TRL can parse;
- a tool answer was cut at `agent.max_tool_output_chars`; replies opened a tool call TRL could not parse.

`no_signal` says, at the end, whether the run was still without a signal: the end summary then says so instead of
judging the pace (agrpo/trainer/console/bottleneck.py: without_signal).

`tool_calls_part` is the step line's tool figure in agent runs (agrpo/trainer/console/callback.py prints both).
"""

from __future__ import annotations

from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.agents.metrics import EPISODES, MALFORMED, TRUNCATED

NO_SIGNAL_STEPS = 5  # steps in a row without a reward spread (or, in an agent run, without a tool call)


def tool_calls(logs: dict[str, Any]) -> float:
    """Tool calls started in one logging window (TRL's per-tool counters)."""
    return sum(
        float(value or 0.0)
        for key, value in logs.items()
        if key.startswith("tools/") and key.endswith("/call_total") and isinstance(value, (int, float))
    )


def tool_calls_part(logs: dict[str, Any]) -> str | None:
    """`tools 0.93/episode` for a step line of an agent run; None when the window logged no episode."""
    episodes = float(logs.get(EPISODES) or 0.0)
    return f"tools {tool_calls(logs) / episodes:.2f}/episode" if episodes else None


class RunNotices:
    """Feed it each step's logs; it returns the notices due (see the module docstring)."""

    def __init__(self, *, agent: bool, max_model_len: int, max_tool_output_chars: int | None):
        self.agent, self.max_model_len, self.cap = agent, max_model_len, max_tool_output_chars
        self.flat_steps = 0
        self.steps_with_episodes = 0
        self.episodes = 0.0
        self.calls = 0.0
        self.malformed = 0.0
        self.said: set[str] = set()

    @classmethod
    def for_config(cls, cfg: RunConfig) -> RunNotices:
        from agrpo.agents.build import agent_enabled

        agent = agent_enabled(cfg.agent)
        return cls(
            agent=agent,
            max_model_len=int(cfg.inference.max_model_len),
            max_tool_output_chars=cfg.agent.max_tool_output_chars if agent else None,
        )

    def observe(self, logs: dict[str, Any]) -> list[str]:
        lines = [self._spread(logs)]
        if self.agent:
            lines += [self._tools(logs), *self._cut_short(logs)]
        return [line for line in lines if line]

    def _once(self, name: str, line: str) -> str | None:
        if name in self.said:
            return None
        self.said.add(name)
        return line

    def _spread(self, logs: dict[str, Any]) -> str | None:
        std, mean = logs.get("reward_std"), logs.get("reward")
        if std is None or mean is None:
            return None
        self.flat_steps = self.flat_steps + 1 if float(std) == 0.0 else 0
        if self.flat_steps < NO_SIGNAL_STEPS:
            return None
        return self._once(
            "spread",
            f"agrpo: for {self.flat_steps} steps every episode of a prompt got the same reward ({float(mean):.3f}, "
            "spread 0): GRPO learns only from differences within a prompt's group, so these steps trained nothing. "
            "Give partial credit (another reward term), make the task easier, raise trainer.num_generations or "
            "trainer.temperature, or start from a model that already solves some of it.",
        )

    def _tools(self, logs: dict[str, Any]) -> str | None:
        episodes = float(logs.get(EPISODES) or 0.0)
        if not episodes:
            return None
        self.steps_with_episodes += 1
        self.episodes += episodes
        self.calls += tool_calls(logs)
        self.malformed += float(logs.get(MALFORMED) or 0.0)
        if self.calls or self.steps_with_episodes < NO_SIGNAL_STEPS:
            return None
        unparsed = (
            f" ({int(self.malformed)} replies opened a tool call TRL could not parse, each reason counted apart as "
            "tools/malformed_<reason>_total: cut, length, json, shape, other; docs/your_agent.md)"
            if self.malformed
            else ""
        )
        return self._once(
            "tools",
            f"agrpo: no tool call in {int(self.episodes)} episodes over {self.steps_with_episodes} steps{unparsed}: "
            "the model does not write tool calls in its chat template's format, so GRPO has no call to reinforce. "
            "TRL's agent training needs a model already tuned for tool calling (e.g. Qwen2.5-Instruct, on a GPU); on "
            "a CPU, warm-start a small model on your tools' call format first: agent.warmstart.enabled=true "
            "(as recipes/agent_smoke.yaml does; docs/your_agent.md section 4).",
        )

    def no_signal(self) -> str | None:
        """Why the run ended without a learning signal, for the end summary (agrpo/trainer/console/bottleneck.py:
        without_signal); None when its last steps had one. An agent run that never called a tool, or a run whose last
        `NO_SIGNAL_STEPS` or more steps had no reward spread."""
        if self.agent and not self.calls and self.steps_with_episodes >= NO_SIGNAL_STEPS:
            return f"no tool call in {int(self.episodes)} episodes"
        if self.flat_steps >= NO_SIGNAL_STEPS:
            return f"reward spread 0 within every prompt's group in the last {self.flat_steps} steps"
        return None

    def _cut_short(self, logs: dict[str, Any]) -> list[str | None]:
        """A tool answer cut at the cap (a refused later turn is said by the rollout child itself, at once:
        agrpo/trainer/rollout/episode.py)."""
        if not logs.get(TRUNCATED):
            return []
        if self.cap is None:  # the cap lifted: only the context guard cuts (agrpo/agents/context_guard.py)
            line = (
                f"agrpo: a tool answered more than inference.max_model_len={self.max_model_len} tokens could hold "
                f"(agent.max_tool_output_chars=null); it was cut there with a marker ({TRUNCATED} counts them) and "
                "its episode ended. Set agent.max_tool_output_chars to cut such answers to what the model can read."
            )
        else:
            line = (
                f"agrpo: a tool answered more than agent.max_tool_output_chars={self.cap} characters; the model saw "
                f"the first {self.cap} and a marker ({TRUNCATED} counts them). Raise the cap if the model needs "
                "whole answers (the episode must still fit inference.max_model_len)."
            )
        return [self._once("cut", line)]
