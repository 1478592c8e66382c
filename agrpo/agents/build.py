"""`agent:` config -> what TRL's AsyncGRPOTrainer takes (`tools`, `environment_factory`, the tool-turn limit), plus the
end-of-run figures. The one place agrpo/trainer/trl_backend.py calls for agents."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from agrpo.agents.environments import build_environment
from agrpo.agents.tools import GuardedTool, build_tools

log = logging.getLogger(__name__)


def agent_section(agent_cfg: Any) -> dict[str, Any]:
    """`agent:` as plain data (resolved): from the composed config the validation pass reads, the run's spec (a
    frozen dataclass: agrpo/config/spec.py) or a plain mapping."""
    if OmegaConf.is_config(agent_cfg):
        return OmegaConf.to_container(agent_cfg, resolve=True)
    if dataclasses.is_dataclass(agent_cfg):
        return dataclasses.asdict(agent_cfg)
    return dict(agent_cfg)


def agent_enabled(agent_cfg: Any) -> bool:
    """Whether the run has tools or an environment (otherwise every rollout is one turn, as before)."""
    section = agent_section(agent_cfg)
    return bool(section.get("tools")) or section.get("environment") is not None


@dataclass
class Agent:
    """The built agent: guarded tools, the environment factory (or {name: factory}) and the tool-turn limit."""

    tools: list[GuardedTool]
    environment: Any
    max_tool_calling_iterations: int | None

    @classmethod
    def from_config(cls, agent_cfg: Any) -> Agent | None:
        """None when the config has no tools and no environment. Raises ConfigError naming an entry that fails."""
        if not agent_enabled(agent_cfg):
            return None
        section = agent_section(agent_cfg)
        timeout, cap = section.get("tool_timeout_s"), section.get("max_tool_output_chars")
        return cls(
            tools=build_tools(section.get("tools") or [], timeout, cap),
            environment=build_environment(section.get("environment"), timeout, cap),
            max_tool_calling_iterations=section.get("max_tool_calling_iterations"),
        )

    def trainer_kwargs(self) -> dict[str, Any]:
        return {"tools": [tool.method for tool in self.tools] or None, "environment_factory": self.environment}

    def factories(self) -> dict[str | None, Any]:
        """{environment name (None for a single factory): factory}."""
        if self.environment is None:
            return {}
        return dict(self.environment) if isinstance(self.environment, dict) else {None: self.environment}

    def environment_classes(self) -> dict[str | None, type]:
        """{environment name: the class its factory makes} (a factory function is called once to find out)."""
        classes = {}
        for name, factory in self.factories().items():
            made = factory.factory
            classes[name] = made if inspect.isclass(made) else type(made(**factory.options))
        return classes

    def reward_names(self) -> list[str]:
        """The reward columns the environments add, as TRL names them: each class with `get_reward`, once."""
        names = []
        for cls in self.environment_classes().values():
            if callable(getattr(cls, "get_reward", None)) and cls.__name__ not in names:
                names.append(cls.__name__)
        return names


def prepare_agent(cfg: Any, args: Any) -> dict[str, Any]:
    """Keyword arguments for AsyncGRPOTrainer: {} without tools or an environment, so a single-turn run builds exactly
    as before. Sets `args.max_tool_calling_iterations`. (An agent's episodes: agrpo/trainer/rollout/episode.py.)"""
    agent = Agent.from_config(cfg.agent)
    if agent is None:
        return {}
    args.max_tool_calling_iterations = agent.max_tool_calling_iterations
    return agent.trainer_kwargs()


def log_agent_summary(summary: dict[str, Any], log_history: list[dict[str, Any]]) -> None:
    """Add the run's agent figures to `summary` (metrics.json) and log their end-of-run line."""
    from agrpo.agents.metrics import agent_summary, summary_line

    figures = agent_summary(log_history)
    if figures:
        summary["agent"] = figures
        log.info("agent: %s", summary_line(figures))
