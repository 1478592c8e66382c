"""A turn that cannot fit the replicas' context ends its episode in the rollout process, before any request is sent.

With `agent.max_tool_output_chars=null`, a tool answering 6 MB went into the next turn whole: TRL rendered six million
tokens, posted a 40 MB body, vLLM refused it (400) and every later step took 57-61 s instead of under 1 s (issue
46). Two cheap checks in agrpo's rollout loop (agrpo/trainer/rollout/episode.py) stop that where it starts:

- `cut_to_fit`: an answer longer than the context could hold at the tokenizer's longest token
  (`max_model_len x max_chars_per_token` characters) can never fit; it is cut there, with agrpo's marker, before
  TRL renders it (a string slice instead of tokenizing megabytes).
- `overflow_detail`: a turn whose prompt leaves no token for the completion is not sent; the loop raises the refusal
  vLLM would have answered (agrpo/trainer/rollout/episode.py ends the episode and counts it under
  `rollout/context_full_total`, or, on a first turn, stops the run naming the row).

Both need `max_model_len`, which the loop reads once from the replicas' `/v1/models` (`served_context`).
"""

from __future__ import annotations

from typing import Any


def served_context(models: Any) -> int | None:
    """The replicas' `max_model_len` from a `/v1/models` answer (pure); None when it does not say."""
    lengths = [m.get("max_model_len") for m in (models or {}).get("data") or [] if isinstance(m, dict)]
    lengths = [n for n in lengths if isinstance(n, int) and n > 0]
    return min(lengths) if lengths else None


def max_chars_per_token(tokenizer: Any) -> int:
    """An upper bound on the characters one token of `tokenizer` stands for: its longest vocabulary entry (added
    tokens included), whose byte-level spelling is at least as long as the text it decodes to."""
    return max(1, max((len(token) for token in tokenizer.get_vocab()), default=1))


def answer_cap(max_model_len: int | None, chars_per_token: int) -> int | None:
    """Characters past which a tool answer cannot fit the context whatever it says (pure); None: unknown context."""
    return None if max_model_len is None else max_model_len * chars_per_token


def context_marker(cut: int, max_model_len: int) -> str:
    """What follows the kept characters of an answer the context could never hold (pure)."""
    return f"\n[... {cut} more characters cut by agrpo: more than inference.max_model_len={max_model_len} tokens hold]"


def cut_to_fit(
    messages: list[dict[str, Any]], cap: int | None, max_model_len: int = 0
) -> tuple[list[dict[str, Any]], int]:
    """(the tool messages with every answer over `cap` characters cut there, how many were cut) (pure)."""
    if cap is None:
        return messages, 0
    kept, cut = [], 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and len(content) > cap:
            message = {**message, "content": content[:cap] + context_marker(len(content) - cap, max_model_len)}
            cut += 1
        kept.append(message)
    return kept, cut


def overflow_detail(prompt_tokens: int, max_model_len: int | None) -> str | None:
    """vLLM's refusal, said before sending, of a prompt that leaves no token for the completion (pure); None when it
    fits or the context is unknown. The words name max_model_len, so the loop counts it as a context too full."""
    if max_model_len is None or prompt_tokens < max_model_len:
        return None
    return (
        f"this turn's prompt is {prompt_tokens} tokens, which leaves no room in max_model_len={max_model_len} "
        "(checked by agrpo before sending it; not sent)"
    )
