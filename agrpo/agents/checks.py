"""The `agent:` checks of the one validation pass (agrpo/config/validate.py), dry run included.

Before anything starts: the limits are in range; every tool and environment factory loads, pickles the way the
spawned rollout process receives it, and can be described to the model (type hints and a docstring that
transformers turns into a JSON schema); an environment has `reset`; some reward source exists (`reward.funcs` or an
environment's `get_reward`); the chat template renders tools and TRL can parse tool calls from it; and with several
environments every data row names one of them. Each problem names the key to change (exit 2).
"""

from __future__ import annotations

import pickle
from typing import Any

from agrpo.agents.build import Agent, agent_enabled, agent_section
from agrpo.errors import ConfigError

ENVIRONMENT_COLUMN = "environment"  # TRL's: the column that picks a row's environment by name
TOOL_TEMPLATES = "qwen2_5, qwen3, llama3_1 or another of TRL's templates that render tools"


def limit_problems(cfg: Any) -> list[str]:
    """Ranges of the agent's limits, and a limit given twice (pure)."""
    section = agent_section(cfg.agent)
    problems = []
    turns = section.get("max_tool_calling_iterations")
    if turns is not None and turns < 1:
        problems.append(f"agent.max_tool_calling_iterations={turns} must be >= 1 (or null: no limit)")
    timeout = section.get("tool_timeout_s")
    if timeout is not None and timeout <= 0:
        problems.append(f"agent.tool_timeout_s={timeout} must be > 0 (or null: no limit)")
    problems += warmstart_problems(section.get("warmstart") or {})
    if "max_tool_calling_iterations" in (cfg.trainer.extra or {}):
        problems.append(
            "trainer.extra.max_tool_calling_iterations duplicates agent.max_tool_calling_iterations: set the "
            "latter only"
        )
    return problems


def warmstart_problems(warm: dict[str, Any]) -> list[str]:
    """Ranges of agent.warmstart's settings (pure)."""
    if not warm.get("enabled"):
        return []
    problems = []
    if not 0 < warm["call_share"] < 1:
        problems.append(f"agent.warmstart.call_share={warm['call_share']} must be in (0, 1)")
    for key in ("rows", "steps", "batch_size"):
        if warm[key] < 1:
            problems.append(f"agent.warmstart.{key}={warm[key]} must be >= 1")
    if warm["learning_rate"] <= 0:
        problems.append(f"agent.warmstart.learning_rate={warm['learning_rate']} must be > 0")
    return problems


def schema_of(tool: Any, key: str) -> tuple[dict | None, str | None]:
    """(the JSON schema TRL will show the model, None) or (None, why it cannot be built)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(tool), None
    except Exception as error:  # transformers raises several types; all mean the same to the user
        return None, (
            f"{key}: TRL cannot describe {getattr(tool, '__name__', tool)!r} to the model ({error}); give every "
            "argument a type hint and the function a Google-style docstring with an `Args:` line per argument"
        )


def pickles(obj: Any) -> str | None:
    """Why `obj` does not survive the pickle round trip to the spawned rollout process, or None."""
    try:
        pickle.loads(pickle.dumps(obj))
        return None
    except Exception as error:  # any failure to pickle is the user's to fix
        return f"{type(error).__name__}: {error}"


def tool_schemas(agent: Agent) -> tuple[list[dict], list[str]]:
    """(every tool's schema, problems): standalone tools, then each environment's tool methods."""
    from agrpo.agents.environments import guarded_class, tool_methods

    schemas, problems, seen = [], [], {}
    for index, tool in enumerate(agent.tools):
        key = f"agent.tools[{index}]"
        schema, problem = schema_of(tool.method, key)
        unpicklable = pickles(tool.method)
        if problem:
            problems.append(problem)
        if unpicklable:
            problems.append(f"{key}={tool.target!r} cannot be sent to TRL's rollout process: {unpicklable}")
        schemas += [schema] if schema else []
        if tool.name in seen:
            problems.append(f"{key} is named {tool.name!r} like {seen[tool.name]}: the model could not tell them apart")
        seen.setdefault(tool.name, key)
    try:
        classes = agent.environment_classes()
    except Exception as error:  # a factory function's own failure: say so
        return schemas, problems + [f"agent.environment: a factory raised when called: {type(error).__name__}: {error}"]
    for name, factory in agent.factories().items():
        key = "agent.environment" + (f".{name}" if name else "")
        unpicklable = pickles(factory)
        if unpicklable:
            problems.append(f"{key} cannot be sent to TRL's rollout process: {unpicklable}")
        cls = classes[name]
        if not callable(getattr(cls, "reset", None)):
            problems.append(f"{key}={factory.target!r}: {cls.__name__} has no `reset` method, which TRL requires")
        guarded = guarded_class(cls, factory.timeout_s)
        for method in tool_methods(cls):
            schema, problem = schema_of(getattr(guarded, method), f"{key} ({cls.__name__}.{method})")
            problems += [problem] if problem else []
            schemas += [schema] if schema else []
            if name is None and method in seen:
                problems.append(f"{key}: {cls.__name__}.{method} has the name of {seen[method]}: rename one")
    return schemas, problems


def reward_problems(cfg: Any, agent: Agent) -> list[str]:
    """Some reward exists: a `reward.funcs` term or an environment's `get_reward`."""
    if cfg.reward.funcs or agent.reward_names():
        return []
    return [
        "reward.funcs is empty and no agent.environment has a `get_reward` method: add a reward term "
        "(e.g. reward=exact_match) or give the environment a get_reward"
    ]


def chat_template(cfg: Any) -> str | None:
    """The template the trainer will use, when it can be read on this machine (model.chat_template, or the local
    model folder's own); None when only the Hub has it or the model is not built yet."""
    from pathlib import Path

    if cfg.model.chat_template:
        from agrpo.models.chat_template import resolve_chat_template

        return resolve_chat_template(str(cfg.model.chat_template))
    folder = Path(str(cfg.model.name_or_path)).expanduser()
    if not (folder / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True).chat_template


def template_problems(template: str | None, schemas: list[dict], model_key: str) -> list[str]:
    """The template renders tool calls, tool messages and the tools' schemas, and TRL can parse its tool calls."""
    if template is None or not schemas:
        return []
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from agrpo.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()  # any tokenizer will do: only the template's text is checked
    tokenizer.chat_template = template
    change = f"set model.chat_template to {TOOL_TEMPLATES} (now {model_key})"
    if not supports_tool_calling(tokenizer):
        return [f"the model's chat template does not render tool calls and tool messages: {change}"]
    try:
        add_response_schema(tokenizer)
    except ValueError:
        return [f"TRL cannot parse tool calls written in the model's chat template (not one it knows): {change}"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=schemas, tokenize=False, add_generation_prompt=True
    )
    hidden = [s["function"]["name"] for s in schemas if s["function"]["name"] not in rendered]
    if hidden:
        return [f"the model's chat template does not show the tools {hidden} to the model: {change}"]
    return []


def row_problems(cfg: Any, agent: Agent) -> list[str]:
    """With several environments, every data row names one of them in its `environment` column."""
    names = [name for name in agent.factories() if name is not None]
    if not names:
        return []
    from agrpo.data import load_train_dataset

    try:
        dataset = load_train_dataset(cfg.data, seed=cfg.trainer.seed)
    except Exception:  # the data's own checks report why it does not load
        return []
    if ENVIRONMENT_COLUMN not in dataset.column_names:
        return [
            f"agent.environment names several environments ({', '.join(names)}), so each data row must pick one in "
            f"an `{ENVIRONMENT_COLUMN}` column, which the data has not (columns: {dataset.column_names})"
        ]
    for index, value in enumerate(dataset[ENVIRONMENT_COLUMN]):
        if value not in names:
            return [
                f"data row {index} has {ENVIRONMENT_COLUMN}={value!r}, which agent.environment does not define "
                f"(it defines {', '.join(names)}): fix the row or add the environment"
            ]
    return []


def agent_problems(cfg: Any, check_environment: bool = True) -> list[str]:
    """Every problem of the `agent:` section; [] when the run has no tools and no environment."""
    if not agent_enabled(cfg.agent):
        return []
    problems = limit_problems(cfg)
    if not check_environment:
        return problems
    try:
        agent = Agent.from_config(cfg.agent)
    except ConfigError as error:
        return problems + [str(error)]
    schemas, found = tool_schemas(agent)
    problems += found
    if found:
        return problems
    problems += reward_problems(cfg, agent)
    model_key = f"model.chat_template={cfg.model.chat_template!r}" if cfg.model.chat_template else "the model's own"
    problems += template_problems(chat_template(cfg), schemas, model_key)
    remote_trainer = cfg.launcher.name == "hf_jobs" and cfg.role == "all"
    return problems + ([] if remote_trainer else row_problems(cfg, agent))
