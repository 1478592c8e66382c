"""What a colleague needs to load and serve an agent's adapter: the warm-started base it was trained on, the tools it
was shown, and the vLLM flags that make a chat request with tools come back as a parsed tool call.

A warm-started run (agent.warmstart) trains its LoRA on a model folder the warm start made from the recipe's base
(agrpo/agents/warmstart.py): full supervised steps, and for a byte-level toy tokenizer new tokens, which no LoRA
can carry and vLLM cannot add to a served base. So the shared artifact has two parts, which `agrpo push` uploads
together: the adapter at the repo's root and that folder under `warm_base/` (a few MB for the tiny model, the base's
size for a real one). The card names the recipe's base model the folder was made from and how.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WARM_BASE = "warm_base"  # the repo folder that holds the warm-started base model
TOOLS_FILE = "agrpo_tools.json"  # the tool schemas as TRL rendered them, written by the warm start
# What opens a tool call in a chat template -> vLLM's parser of it (`--tool-call-parser`).
PARSERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"), ("[TOOL_CALLS]", "mistral"))


def tool_call_parser(template: str | None) -> str | None:
    """vLLM's tool-call parser for a chat template, from the marker its tool calls open with (pure); None: unknown."""
    for marker, parser in PARSERS:
        if template and marker in template:
            return parser
    return None


def serve_flags(template: str | None, has_tools: bool) -> list[str]:
    """The flags vLLM's chat API needs to answer with parsed tool calls (pure); none for a run without tools or a
    template whose parser is unknown (the card then says to pick one)."""
    parser = tool_call_parser(template)
    if not has_tools or parser is None:
        return []
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def context_length(folder: Path) -> int | None:
    """The model's own context (config.json's max_position_embeddings), which any prompt it was trained on fits."""
    config = _read_json(folder / "config.json") or {}
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def chat_template_text(folder: Path) -> str | None:
    """The chat template saved in a model or adapter folder (chat_template.jinja, else tokenizer_config.json's)."""
    try:
        return (folder / "chat_template.jinja").read_text()
    except OSError:
        template = (_read_json(folder / "tokenizer_config.json") or {}).get("chat_template")
        return template if isinstance(template, str) else None


def warm_base_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The warm start of a run's resolved config: its folder, the recipe's base, how that base is made and the
    supervised steps; None for a run without one (or whose folder is gone: push says so)."""
    warm = (config.get("agent") or {}).get("warmstart") or {}
    folder = (config.get("model") or {}).get("name_or_path")
    if not warm.get("base_model") or not folder:
        return None
    folder = Path(str(folder)).expanduser()
    spec = _read_json(folder.with_name(folder.name + ".spec.json")) or {}
    base = spec.get("base") or {}
    return {
        "folder": folder,
        "recipe_base": str(warm["base_model"]),
        "builder": base.get("builder"),
        "steps": warm.get("steps"),
        "learning_rate": warm.get("learning_rate"),
        "example": (spec.get("rows") or [{}])[0].get("prompt"),
    }


def example_messages(prompt: Any) -> list[dict[str, Any]]:
    """A chat request's messages from a data row's prompt (a string or a list of messages)."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        return [{"role": m.get("role"), "content": m.get("content")} for m in prompt]
    return [{"role": "user", "content": str(prompt) if prompt else "Hello!"}]


def saved_tools(folder: Path) -> list[dict[str, Any]] | None:
    """The tool schemas a warm start saved in its folder, in the order and key order TRL renders them."""
    tools = _read_json(folder / TOOLS_FILE)
    return tools if isinstance(tools, list) else None


def live_tools(config: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The run's tool schemas built from its config here (the tools' files must be where the run read them); None
    when the run had no tools or they do not load here."""
    from omegaconf import OmegaConf

    from agrpo.agents.build import Agent
    from agrpo.agents.prompt_budget import schemas_by_environment

    try:
        agent = Agent.from_config(OmegaConf.create(config.get("agent") or {}))
        shown = schemas_by_environment(agent) if agent is not None else {}
    except Exception:  # a tool that does not import here: the card shows no tool list
        return None
    return (next(iter(shown.values())) or None) if len(shown) == 1 else None
