"""The one way every reward is called, in training and in `agrpo eval`, and what a failing reward says.

The form: ``reward(completions=..., prompts=..., completion_ids=..., **columns)`` where each completion is a list of
chat messages (``[{"role": "assistant", "content": "..."}]``, more messages when tools answered), each prompt a list
of chat messages, and every other dataset column a list with one value per completion. That is what TRL's rollout
worker passes in training; `agrpo eval` passes the same (`as_messages`), so a reward that works in one works in the
other. `completion_text(c)` (agrpo.rewards) reads the text of either a message list or a plain string.

`call_reward` calls one term and checks its answer (one float or None per completion); anything else, or any
exception, becomes a `RewardError`: one paragraph naming the term, the error, where in the user's code it was raised
and the row being scored. The rollout guard (agrpo/trainer/rollout/guard.py) raises it in TRL's scoring process and
the trainer ends the run with it; `agrpo eval` prints it the same way.
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agrpo.errors import AgrpoError

# The arguments TRL passes to every reward itself; everything else is a dataset column.
TRL_ARGUMENTS = ("completions", "prompts", "completion_ids")
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # agrpo/
_ROW_CHARS = 300


class RewardError(AgrpoError):
    """A reward term raised or answered in the wrong shape; the message is the whole story, in one paragraph."""


def as_messages(text: str) -> list[dict[str, str]]:
    """A generated text in the form rewards receive it: one assistant message."""
    return [{"role": "assistant", "content": text}]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _prompt_text(prompt: Any) -> str:
    """The last user turn of a chat prompt (what identifies a row to its author; else its last turn), or the text."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, Mapping) for m in prompt):
        users = [m.get("content") for m in prompt if m.get("role") == "user"]
        return str(users[-1] if users else prompt[-1].get("content"))
    return str(prompt)


def describe_row(kwargs: Mapping[str, Any], limit: int = _ROW_CHARS) -> str:
    """The row a reward was scoring, as its author would recognise it: the prompt's last user turn, then the
    dataset columns (each column holds one value per completion of the row; the first is shown)."""
    prompts = kwargs.get("prompts") or [None]
    parts = [f"prompt {_short(_prompt_text(prompts[0]))}"]
    for key, values in kwargs.items():
        if key in TRL_ARGUMENTS:
            continue
        value = values[0] if isinstance(values, list) and values else values
        parts.append(f"{key}={_short(value, 60)}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def raised_at(error: BaseException) -> str:
    """Where the error was raised, in the user's code when the traceback passes through it: `file, line N`."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""

    def library(filename: str) -> bool:
        return filename.startswith(_PACKAGE_DIR) or "site-packages" in filename or "/lib/python3" in filename

    user = [f for f in frames if not library(f.filename)]
    frame = (user or frames)[-1]
    return f"{Path(frame.filename).name}, line {frame.lineno}"


def _hint(error: BaseException) -> str:
    """What a likely mistake means: treating a completion (a list of messages) as a string."""
    message = str(error)
    if isinstance(error, (AttributeError, TypeError)) and ("'list' object" in message or "'dict' object" in message):
        return (
            " A completion reaches every reward as a list of chat messages ([{'role': 'assistant', 'content': ...}]), "
            "in training and in `agrpo eval` alike: read its text with agrpo.rewards.completion_text(completion)."
        )
    return ""


def reward_failure(name: str, error: BaseException, kwargs: Mapping[str, Any]) -> str:
    """The paragraph for a reward term that raised while scoring a row."""
    where = raised_at(error)
    return (
        f"reward term {name!r} raised {type(error).__name__}: {error}"
        + (f" ({where})" if where else "")
        + f" while scoring the row [{describe_row(kwargs)}].{_hint(error)}"
    )


def _is_score(value: Any) -> bool:
    """None (leave the completion out) or a number (bools and numpy scalars count: TRL sums them as floats)."""
    if value is None or isinstance(value, numbers.Real):
        return True
    try:
        return not isinstance(value, (str, bytes)) and isinstance(float(value), float)
    except (TypeError, ValueError):
        return False


def call_reward(reward: Callable[..., Any], name: str, kwargs: Mapping[str, Any]) -> list[float | None]:
    """Call one reward term the way TRL does and return its scores; a RewardError on any failure (see module)."""
    count = len(kwargs["completions"])
    try:
        scores = list(reward(**kwargs))
    except RewardError:
        raise
    except Exception as error:  # any failure of user code becomes the one paragraph
        raise RewardError(reward_failure(name, error, kwargs)) from error
    wrong = next((s for s in scores if not _is_score(s)), "ok")
    if len(scores) != count or wrong != "ok":
        problem = (
            f"returned {len(scores)} scores for {count} completions"
            if len(scores) != count
            else f"returned {_short(wrong, 40)} among its scores"
        )
        raise RewardError(
            f"reward term {name!r} {problem} while scoring the row [{describe_row(kwargs)}]: a reward returns one "
            "float (or None, to leave a completion out) per completion, in order"
        )
    floats = [None if s is None else float(s) for s in scores]
    not_finite = [s for s in floats if s is not None and not math.isfinite(s)]
    if not_finite:
        raise RewardError(not_finite_message(name, not_finite, count, kwargs))
    return floats


def not_finite_message(name: str, values: list[float], count: int, kwargs: Mapping[str, Any]) -> str:
    """NaN or infinity is never a score: TRL would silently turn NaN into "left out" and infinity into NaN
    advantages, so the run ends naming the term, the value and how many completions got it."""
    shown = ", ".join(sorted({repr(v) for v in values}))
    return (
        f"reward term {name!r} returned {shown} for {len(values)} of {count} completions while scoring the row "
        f"[{describe_row(kwargs)}]: a score must be a finite number; return None to leave a completion out of "
        "training on purpose (NaN and infinity usually come from a division by zero or a log of 0 in the reward)"
    )
