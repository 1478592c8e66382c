"""The warm start's supervised examples, pure: episodes built from a run's tools and rows, and their tokens.

One example per data row. A calling example is the row's prompt, a call of the warm-start tool with the row's own
argument values (`agent.warmstart.arguments`: tool argument -> column, else the column of the argument's name), the
tool's real answer to that call, and the final answer (`agent.warmstart.answer`, default: the tool's answer). A
guessing example is the prompt and, at once, the final answer of another row: a plausible answer that is wrong.

Every example is rendered as the rollout loop renders an episode (the chat template, the tool list) and only the
model's own tokens are trained: the call (but its first token, the decision to call, only in `call_share` of the
examples), and the final answer. So the warm model writes a well-formed call with the row's arguments when it calls,
answers from the tool's reply, and calls in only about `call_share` of its episodes: GRPO learns when to call.
"""

from __future__ import annotations

import inspect
import random
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

IGNORE = -100  # label of context tokens: not trained


@dataclass(frozen=True)
class Episode:
    prompt: list[dict[str, Any]]  # the row's chat prompt
    answer: str  # the final answer
    call: dict[str, Any] | None = None  # {"name":, "arguments":} when the episode calls the tool
    output: str = ""  # the tool's answer to that call
    train_call: bool = True  # whether the call's first token (the decision to call) is trained


def call_arguments(
    parameters: Sequence[str], required: Sequence[str], row: Mapping[str, Any], mapping: Mapping[str, str]
):
    """{argument: value from the row} of one call: `mapping` names the column of an argument, else the column of its
    own name; an optional argument without a column is left out. Raises ValueError naming what is missing."""
    unknown = sorted(set(mapping) - set(parameters))
    if unknown:
        raise ValueError(
            f"agent.warmstart.arguments names {unknown}, which the tool does not take ({list(parameters)})"
        )
    arguments = {}
    for name in parameters:
        column = mapping.get(name, name)
        if column in row:
            arguments[name] = row[column]
        elif name in mapping or name in required:
            raise ValueError(
                f"argument {name!r} of the tool reads column {column!r}, which the rows do not have (their columns "
                f"are {sorted(row)}): set agent.warmstart.arguments.{name} to a column"
            )
    return arguments


def argument_mappings(arguments: Mapping[str, Any], parameters: Mapping[str, Sequence[str]]) -> dict[str, dict]:
    """{tool: {argument: column}} from `agent.warmstart.arguments`, whose entries are `argument: column` (for every
    called tool that takes the argument) or `tool: {argument: column}` (for that tool, winning). `parameters`: each
    called tool's arguments. Raises ValueError naming an entry that no called tool takes."""
    flat = {key: value for key, value in arguments.items() if not isinstance(value, Mapping)}
    own = {key: dict(value) for key, value in arguments.items() if isinstance(value, Mapping)}
    taken = {name for params in parameters.values() for name in params}
    unknown = sorted(set(flat) - taken) + sorted(f"{t}.{a}" for t, m in own.items() for a in m if t not in parameters)
    unknown += sorted(f"{t}.{a}" for t, m in own.items() if t in parameters for a in m if a not in parameters[t])
    if unknown:
        raise ValueError(
            f"agent.warmstart.arguments names {unknown}, which no tool the examples call takes (their arguments: "
            f"{ {name: list(params) for name, params in parameters.items()} })"
        )
    return {
        name: {**{k: v for k, v in flat.items() if k in params}, **own.get(name, {})}
        for name, params in parameters.items()
    }


def tool_parameters(function: Callable[..., Any]) -> tuple[list[str], list[str]]:
    """(every argument the model passes, the required ones) of a tool as the model sees it."""
    params = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return [p.name for p in named], [p.name for p in named if p.default is inspect.Parameter.empty]


def answer_fields(template: str) -> list[str]:
    """The fields `agent.warmstart.answer` reads (`output` is the tool's answer; the rest are columns)."""
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def final_answer(template: str, output: str, row: Mapping[str, Any]) -> str:
    return template.format_map({**row, "output": output})


def episodes(
    prompts: Sequence[list[dict[str, Any]]],
    calls: Sequence[dict[str, Any]],
    outputs: Sequence[str],
    answers: Sequence[str],
    call_share: float,
    seed: int,
) -> list[Episode]:
    """Two episodes per row: one that calls and answers from the tool's reply, one that guesses (another row's
    answer); the decision to call is trained in as many calling episodes as make `call_share` of all decisions."""
    rng = random.Random(seed)
    trained_calls = min(1.0, call_share / (1 - call_share))  # of the calling half, against the guessing half
    made = []
    for index, (prompt, call, output, answer) in enumerate(zip(prompts, calls, outputs, answers)):
        made.append(Episode(prompt, answer, call, output, rng.random() < trained_calls))
        others = [a for a in answers if a != answer] or [answer]
        made.append(Episode(prompt, rng.choice(others)))
    return made


def tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": call["name"], "arguments": dict(call["arguments"])}}


def tokens(render: Callable[[list[dict], bool], list[int]], encode: Callable[[str], list[int]], eos: int, ep: Episode):
    """(token ids, labels, where the tool's answer starts) of one episode. `render(messages, generation)` renders as
    the rollout worker does (with the tools); `encode` tokenizes plain text. Raises ValueError when the template does
    not keep earlier turns as they were (TRL cannot train on it either)."""
    prompt = render(ep.prompt, True)
    ids, labels = list(prompt), [IGNORE] * len(prompt)
    tool_start = len(ids)
    if ep.call is not None:
        called = {"role": "assistant", "content": "", "tool_calls": [tool_call(ep.call)]}
        written = render([*ep.prompt, called], False)[len(prompt) :]
        turn = written[: written.index(eos) + 1] if eos in written else written
        reply = {"role": "tool", "name": ep.call["name"], "content": ep.output}
        answered = render([*ep.prompt, called, reply], True)
        if answered[: len(prompt) + len(turn)] != prompt + turn:
            raise ValueError("the chat template does not keep earlier turns as they were: TRL cannot train on it")
        decision = turn[:1] if ep.train_call else [IGNORE]
        after = answered[len(prompt) + len(turn) :]
        ids += turn + after
        labels += decision + turn[1:] + [IGNORE] * len(after)
        tool_start += len(turn)
    answer = encode(ep.answer) + [eos]
    return ids + answer, labels + answer, tool_start


def answer_snippets(rows: list[tuple[list[int], list[int], int]], rng: random.Random, copies: int, vocab: int):
    """Short rows that teach the answer after a tool reply alone: the reply and the answer, after a few random
    tokens. Copying the reply is learnt in tens of steps on such rows, and only after hundreds inside whole episodes
    (a long, nearly constant context hides the tokens that matter)."""
    snippets = []
    for ids, labels, tool_start in [row for row in rows if row[2] < len(row[0]) - 2] * copies:  # calling episodes
        prefix = [rng.randrange(min(vocab, 256)) for _ in range(rng.randrange(4, 24))]
        snippets.append((prefix + ids[tool_start:], [IGNORE] * len(prefix) + labels[tool_start:], len(prefix)))
    return snippets


def call_snippets(rows: list[tuple[list[int], list[int], int]], eos: int, rng: random.Random, copies: int, vocab: int):
    """Short rows that teach the call's arguments alone: the user's turn (after the system turn, which holds the
    tool list) and the call, after a few random tokens. Copying the row's values into the call is learnt much
    faster so than inside whole episodes."""
    snippets = []
    for ids, labels, tool_start in [row for row in rows if row[2] < len(row[0]) - 2] * copies:  # calling episodes
        first = ids.index(eos) + 1 if eos in ids[:tool_start] else 0  # after the system turn, when there is one
        start = first if first < tool_start - 1 else 0
        prefix = [rng.randrange(min(vocab, 256)) for _ in range(rng.randrange(2, 12))]
        body = labels[start:tool_start]
        snippets.append((prefix + ids[start:tool_start], [IGNORE] * len(prefix) + body, len(prefix)))
    return snippets


def recurring_strings(values: Sequence[Any], most: int = 64, longest: int = 24) -> list[str]:
    """Short strings among `values` with at most `most` distinct ones (categorical: unit names, words), else none:
    what a real tokenizer's merges would make single tokens of, and a byte-level toy tokenizer does not."""
    found = sorted({v for v in values if isinstance(v, str) and 1 < len(v) <= longest and v.strip() == v})
    return found if len(found) <= most else []


WARM_ANSWER_CHARS = 64  # characters of a tool's answer a warm-start example shows, whatever the run's cap


def example_answer(output: str, most: int = WARM_ANSWER_CHARS) -> str:
    """A tool's answer as a warm-start example shows it (pure): whole when short, else its first `most` characters
    and an ellipsis. Independent of agent.max_tool_output_chars: a 6 MB answer cut at the run's cap, with its
    marker, made every example 381 tokens instead of 103 (issue 46); the examples teach the call's format and
    copying a short answer, which a long one's head teaches as well."""
    return output if len(output) <= most else output[:most] + "..."


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """The warm start's progress, with an estimate of what is left (pure)."""
    rate = elapsed_s / done if done else 0.0
    left = rate * (total - done)
    return (
        f"agent.warmstart: {done}/{total} supervised batches ({done / total:.0%}), {elapsed_s:.0f} s so far, "
        f"about {left // 60:.0f} min {left % 60:02.0f} s left"
    )
