"""Why TRL could not parse a reply's tool call, pure: a reply that opens a call TRL cannot read is taken as a plain
answer and its episode ends, and issue 46's runs had 25-27 such replies each with nothing saying why.

Each is counted under one reason (`tools/malformed_<reason>_total`, summed per step like every `_total` key):
- `cut`: the call never closes: the model ended its turn inside it (its end-of-turn token, `<|im_end|>`, came before
  `</tool_call>`), which the tiny model does after skipping or garbling a piece of the call;
- `length`: the call never closes and the reply has no end-of-turn token: it stopped at
  `trainer.max_completion_length` mid-call;
- `json`: the text between the tags is not JSON;
- `shape`: JSON, but not `{"name": <str>, "arguments": {...}}`;
- `other`: it reads as a call here, and TRL's parser still refused it (another template's format).
"""

from __future__ import annotations

import json
import re

REASONS = ("cut", "length", "json", "shape", "other")
# the end-of-turn tokens of the chat templates agrpo knows (ChatML/Qwen/SmolLM2, Llama 3, Gemma, Mistral), as a reply
# decoded with its special tokens ends when the model ended it; a reply stopped at the length limit ends otherwise
END_OF_TURN = re.compile(r"(<\|im_end\|>|<\|eot_id\|>|<\|endoftext\|>|<\|end\|>|<end_of_turn>|</s>)\s*$")


def reason_key(reason: str) -> str:
    return f"tools/malformed_{reason}_total"


REASON_KEYS = tuple(reason_key(reason) for reason in REASONS)


def malformed_reason(text: str, opener: re.Pattern) -> str:
    """The reason a reply that opens a tool call was not parsed (the module docstring's list)."""
    start = opener.search(text)
    body = text[start.end() :] if start else text
    closed = re.search(r"</tool_call>", body)
    if closed is None:
        return "cut" if END_OF_TURN.search(body) else "length"
    inner = body[: closed.start()].strip()
    try:
        call = json.loads(inner)
    except ValueError:
        return "json"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "shape"
    if not isinstance(call.get("arguments", {}), dict):
        return "shape"
    return "other"


def reasons_part(figures: dict[str, float]) -> str:
    """` (cut 20, json 5)`: the reasons of a run's malformed calls for its summary line (pure); '' when none."""
    counted = [f"{reason} {int(figures[reason_key(reason)])}" for reason in REASONS if figures.get(reason_key(reason))]
    return f" ({', '.join(counted)})" if counted else ""
