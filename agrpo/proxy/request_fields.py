"""Read only what routing needs from a raw completion request body.

The body itself is forwarded untouched. A token-id prompt (thousands of ints) is not parsed
at all: its characters are located, checked to hold only digits and commas, stripped of
whitespace and later hashed; the small rest of the body goes through the C JSON decoder, which
also validates it. Anything unusual falls back to one full parse, so the fast path changes
only what routing costs, never what gets routed.
"""

import json
import re
from dataclasses import dataclass

from agrpo.proxy.prompts import Prompt, conversation_text

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_PLACEHOLDER = "\x00agrpo-prompt"
_PLACEHOLDER_JSON = json.dumps(_PLACEHOLDER)
_BLANKS = b" \t\r\n"
_TOKEN_CHARS = b"0123456789,"


class BadRequest(ValueError):
    """The body is not a JSON object; the message says where."""


@dataclass(slots=True)
class RoutingFields:
    """The routing-relevant part of one request."""

    model: str
    prompts: list[Prompt]
    n: int = 1
    max_tokens: int | None = None
    stream: bool = False


# Far above anything vLLM serves, far below what overflows the load arithmetic.
MAX_N = 1 << 16
MAX_TOKENS = (1 << 31) - 1


def parse_routing_fields(raw: bytes) -> RoutingFields:
    """Extract model, prompts, n, max_tokens and stream from a JSON request body.

    `n`, `best_of`, `min_tokens`, `max_tokens` and `max_completion_tokens` that are not JSON integers in range,
    and absurdly nested JSON, are BadRequest (400), never an exception deeper in the proxy (a 500).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"request body is not UTF-8 (byte {err.start})") from None
    try:
        return _fields(text)
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None


def _fields(text: str) -> RoutingFields:
    values, prompts = _split_prompt(text)
    if prompts is None:
        values = _loads(text)
        if "prompt" in values:
            prompts = _prompts_from_value(values["prompt"])
        elif "messages" in values:
            prompts = [Prompt.from_text(conversation_text(values["messages"]))]
        else:
            prompts = [Prompt.from_text("")]
    model = values.get("model")
    n = _integer(values, "n", 1, MAX_N)
    _integer(values, "best_of", 1, MAX_N)
    _integer(values, "min_tokens", 0, MAX_TOKENS)
    max_tokens = _integer(values, "max_tokens", 0, MAX_TOKENS)
    completion_tokens = _integer(values, "max_completion_tokens", 0, MAX_TOKENS)
    return RoutingFields(
        model=model if isinstance(model, str) else "",
        prompts=prompts or [Prompt.from_text("")],
        n=1 if n is None else n,
        max_tokens=max_tokens if max_tokens is not None else completion_tokens,
        stream=values.get("stream") is True,
    )


def _integer(values: dict, key: str, low: int, high: int) -> int | None:
    """The value of `key` if it is a JSON integer in low..high, None if absent or null; anything else is a
    BadRequest. Floats (`1e9`, even `3.0`), strings of digits and booleans are refused: vLLM would coerce some of
    them, so they would slip past the range check and the load accounting."""
    value = values.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise BadRequest(f"{key!r} must be a JSON integer between {low} and {high}, got {_short(value)}")
    if not low <= value <= high:
        raise BadRequest(f"{key!r} must be between {low} and {high}, got {_short(value)}")
    return value


def _short(value) -> str:
    """A value for an error message: 400 digits (or a 1 MB string) are not worth echoing."""
    if type(value) is int and abs(value) >= 10**30:
        return f"a {len(str(abs(value)))}-digit number"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _split_prompt(text: str) -> tuple[dict, list[Prompt] | None]:
    """Fast path: cut a token-id `prompt` out, parse the small rest with the C decoder.

    A quoted `"prompt"` followed by ':' is a key (a quote cannot occur unescaped inside a JSON
    string); a nested key or a duplicate is caught because the top-level value must then be
    the placeholder. Returns (fields, None) when the fast path does not apply.
    """
    key = text.find('"prompt"')
    if key < 0:
        return {}, None
    skip = _WHITESPACE.match
    colon = skip(text, key + 8).end()
    if not text.startswith(":", colon):
        return {}, None
    start = skip(text, colon + 1).end()
    if not text.startswith("[", start):
        return {}, None
    found = _token_lists(text, start)
    if found is None:
        return {}, None
    prompts, stop = found
    values = _loads(text[:start] + _PLACEHOLDER_JSON + text[stop:])
    if values.get("prompt") != _PLACEHOLDER:
        return {}, None
    return values, prompts


def _loads(text: str) -> dict:
    try:
        values = json.loads(text)
    except ValueError as err:
        raise BadRequest(f"malformed JSON: {err}") from None
    if not isinstance(values, dict):
        raise BadRequest("request body must be a JSON object")
    return values


def _token_lists(text: str, i: int):
    """Fast path for `[ids...]` and `[[ids...], ...]`; None when the value is anything else."""
    skip = _WHITESPACE.match
    j = skip(text, i + 1).end()
    if text.startswith("[", j):  # a batch of token lists
        prompts = []
        while True:
            close = text.find("]", j)
            if close < 0:
                return None
            ids = _canonical_ids(text[j + 1 : close])
            if ids is None:
                return None
            prompts.append(Prompt(ids, True))
            j = skip(text, close + 1).end()
            if text.startswith(",", j):
                j = skip(text, j + 1).end()
                if not text.startswith("[", j):
                    return None
                continue
            if text.startswith("]", j):
                return prompts, j + 1
            return None
    close = text.find("]", j)
    if close < 0:
        return None
    if close == j:  # an empty list
        return [Prompt(b"", True)], close + 1
    ids = _canonical_ids(text[j:close])
    if ids is None:
        return None
    return [Prompt(ids, True)], close + 1


def _canonical_ids(inside: str) -> bytes | None:
    """`"1, 2,3"` -> `b"1,2,3"`; None unless it holds only digits, commas and blanks."""
    try:
        raw = inside.encode("ascii")
    except UnicodeEncodeError:
        return None
    ids = raw.translate(None, _BLANKS)
    if not ids or ids.translate(None, _TOKEN_CHARS) or ids[0] == 44 or ids[-1] == 44:
        return None
    return ids


def _prompts_from_value(value) -> list[Prompt]:
    """Slow path: any prompt shape vLLM accepts (text, token ids, or batches of either)."""
    if isinstance(value, str):
        return [Prompt.from_text(value)]
    if isinstance(value, list):
        if not value:
            return [Prompt(b"", True)]
        if all(type(v) is int for v in value):
            return [Prompt.from_token_ids(value)]
        if all(isinstance(v, str) for v in value):
            return [Prompt.from_text(v) for v in value]
        if all(isinstance(v, list) and all(type(t) is int for t in v) for v in value):
            return [Prompt.from_token_ids(v) for v in value]
    return [Prompt.from_text(json.dumps(value, sort_keys=True))]
