r"""Prompt formatting for math problems: an optional system prompt, then the problem followed by an instruction.

The chat template is applied later by the rollout loop, so a prompt here is a list of chat messages.
"""

from __future__ import annotations

from typing import Any

# The Sanity dataset's own instruction (and DeepSeek-R1's): the accuracy rewards read the last \boxed{}.
DEFAULT_INSTRUCTION = r"Please reason step by step, and put your final answer within \boxed{}."


def problem_text(value: Any, instruction: str | None = None) -> str:
    """The problem statement, from a string or from a chat prompt (its last user message, less a trailing instruction).

    Hub datasets such as Sanity ship ready-made chat prompts; taking the problem back out lets every dataset be
    formatted by the same recipe settings instead of whatever the dataset's authors chose.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m for m in value if m.get("role") == "user"]
        if not users:
            raise ValueError(f"a chat prompt without a user message: {value!r}")
        text = str(users[-1].get("content") or "")
    else:
        raise ValueError(f"cannot read a problem from a {type(value).__name__}: {value!r}")
    for suffix in (instruction, DEFAULT_INSTRUCTION):
        if suffix and text.rstrip().endswith(suffix):
            text = text.rstrip()[: -len(suffix)]
    return text.strip()


def build_prompt(
    problem: str, system_prompt: str | None = None, instruction: str | None = DEFAULT_INSTRUCTION
) -> list[dict[str, str]]:
    """Chat messages for one problem: the system prompt if any, then the problem and the instruction as one user turn.

    The instruction follows the problem after a space, as in the Sanity dataset's prompts.
    """
    content = f"{problem} {instruction}" if instruction else problem
    messages = [{"role": "user", "content": content}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages
