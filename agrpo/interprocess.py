"""What one agrpo process reads that another wrote, parsed at one guarded boundary: the trainer's step lines
(`fleet/steps.jsonl`), the controller's `fleet/state.json`, the proxy's `/proxy/stats` answers, a run's
`metrics.json` and `log_history.json`, a checkpoint's `rollout_state.json`, a Jobs run's `fleet.json`.

Why: a writer can die mid-line, a disk can hand back garbage, another version can write other types, and Python's
json accepts `NaN`, `Infinity` and `1e999` (inf). A reader that does `entry.get` on what it got ends the run on the
first line that is not an object (issue 42: `[1]` in steps.jsonl stopped a run 6 s later). Here every input is
turned into a typed record or rejected with a reason; nothing else raises. Readers that can go on without the input
skip and count it (`Skipped`: the first bad input of each source is logged once, the rest only counted); readers
whose input must not be guessed (a checkpoint to resume, the fleet's Job template) refuse with one paragraph that
names the file and the line (`refusal`). docs/failures.md lists which is which.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_INPUT_BYTES = 16 * 1024 * 1024  # a line or file larger than this is not one of ours
MAX_NUMBER = 1e15  # larger magnitudes are garbage for every figure exchanged (times, counts, rewards, versions)


class BadInput(ValueError):
    """An input rejected at the boundary; `str()` is the reason, in words."""


Checker = Callable[[Any, str], Any]  # (value, field name) -> the typed value, or raise BadInput


def _no_constant(name: str) -> Any:
    raise BadInput(f"{name} is not a finite number")


def _none_for_constant(_name: str) -> None:
    return None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadInput(f"{text} is not a finite number")
    return value


def parse_json(data: bytes | str, non_finite: str = "reject") -> Any:
    """One JSON document (a line or a whole file), or BadInput. `non_finite="null"` reads NaN/Infinity/1e999 as
    None (a summary that may hold a diverged run's NaN) instead of rejecting the document."""
    if len(data) > MAX_INPUT_BYTES:
        raise BadInput(f"{len(data)} bytes, over the {MAX_INPUT_BYTES} a record may have")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as error:
        raise BadInput(f"not UTF-8 ({error.reason} at byte {error.start})") from None
    if not text.strip():
        raise BadInput("empty")
    lenient = non_finite == "null"
    constant = _none_for_constant if lenient else _no_constant
    number = (lambda s: v if math.isfinite(v := float(s)) else None) if lenient else _finite
    try:
        return json.loads(text, parse_constant=constant, parse_float=number)
    except BadInput:
        raise
    except (ValueError, RecursionError) as error:  # cut off mid-line, not JSON, nested too deep, huge integers
        raise BadInput(f"not JSON ({str(error)[:120] or type(error).__name__})") from None


def kind_of(value: Any) -> str:
    """A JSON value's kind in JSON's words (for reasons)."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def number(value: Any, name: str, minimum: float | None = 0.0) -> float:
    """A finite number within +-MAX_NUMBER (and >= minimum); booleans are not numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{name} is {kind_of(value)}, not a number")
    if not (-MAX_NUMBER <= value <= MAX_NUMBER):  # NaN fails this too; an int of any size compares fine
        raise BadInput(f"{name} is {str(value)[:40]}, not a finite number within {MAX_NUMBER:g}")
    if minimum is not None and value < minimum:
        raise BadInput(f"{name} is {value}, below {minimum:g}")
    return float(value)


def signed(value: Any, name: str) -> float:
    return number(value, name, minimum=None)


def integer(value: Any, name: str) -> int:
    figure = number(value, name)
    if figure != int(figure):
        raise BadInput(f"{name} is {figure}, not a whole number")
    return int(figure)


def text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{name} is {kind_of(value)}, not a string")
    return value


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise BadInput(f"{name} is {kind_of(value)}, not true or false")
    return value


def mapping(of: Checker, key: Checker = text) -> Checker:
    """An object whose every value passes `of` (and every key `key`: text, or e.g. a whole number's digits)."""

    def check(value: Any, name: str) -> dict:
        if not isinstance(value, dict):
            raise BadInput(f"{name} is {kind_of(value)}, not an object")
        return {key(k, f"{name} key {k!r}"): of(v, f"{name}[{k!r}]") for k, v in value.items()}

    return check


def digits(value: Any, name: str) -> int:
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 6):
        raise BadInput(f"{name} is not a whole number")
    return int(value)


def array(of: Checker) -> Checker:
    def check(value: Any, name: str) -> list:
        if not isinstance(value, list):
            raise BadInput(f"{name} is {kind_of(value)}, not an array")
        return [of(item, f"{name}[{i}]") for i, item in enumerate(value)]

    return check


def record(fields: Mapping[str, Checker], required: tuple[str, ...] = (), keep_unknown: bool = False) -> Checker:
    """An object whose listed fields pass their checks (null counts as absent); other fields are dropped, or kept
    as they are with `keep_unknown`."""

    def check(value: Any, name: str = "the record") -> dict:
        if not isinstance(value, dict):
            raise BadInput(f"{name} is {kind_of(value)}, not an object")
        missing = [key for key in required if value.get(key) is None]
        if missing:
            raise BadInput(f"{name} has no {', '.join(missing)}")
        out = {key: item for key, item in value.items() if key not in fields} if keep_unknown else {}
        for key, checker in fields.items():
            if value.get(key) is not None:
                out[key] = checker(value[key], key)
        return out

    return check


def numbers(value: Any, name: str = "the record") -> dict[str, float]:
    """An object of non-negative finite numbers (a step line); null values are dropped."""
    if not isinstance(value, dict):
        raise BadInput(f"{name} is {kind_of(value)}, not an object")
    return {key: number(item, key) for key, item in value.items() if item is not None}


def parse_record(data: bytes | str, check: Checker, non_finite: str = "reject") -> Any:
    """One line or file into its typed record, or BadInput with the reason."""
    return check(parse_json(data, non_finite), "the record")


@dataclass
class Skipped:
    """Bad inputs skipped, by source (a file's name, an URL). The first of each source is logged at WARNING with
    its reason; later ones only counted (a writer gone wrong must not flood the log)."""

    counts: dict[str, int] = field(default_factory=dict)
    logger: logging.Logger = log

    def skip(self, source: str, reason: str, where: str = "") -> None:
        self.counts[source] = self.counts.get(source, 0) + 1
        if self.counts[source] == 1:
            at = f" {where}" if where else ""
            self.logger.warning("skipped a bad input in %s%s: %s (later ones are only counted)", source, at, reason)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """`3 bad line(s) skipped in steps.jsonl` or ''."""
        return "; ".join(f"{count} bad input(s) skipped in {source}" for source, count in sorted(self.counts.items()))


SKIPPED = Skipped()  # what this process skipped, where no reader keeps its own count


def parse_lines(data: bytes, check: Checker, source: str, skipped: Skipped = SKIPPED, first_line: int = 1) -> list:
    """Every complete line of `data` that passes `check`; each other non-blank line is skipped and counted."""
    good = []
    for index, line in enumerate(data.split(b"\n"), start=first_line):
        if not line.strip():
            continue
        try:
            good.append(parse_record(line, check))
        except BadInput as error:
            skipped.skip(source, str(error), f"line {index}")
    return good


def read_record(
    path: str | Path, check: Checker, skipped: Skipped = SKIPPED, default: Any = None, non_finite: str = "reject"
) -> Any:
    """The record in a whole file, or `default` when there is none (not counted) or it is bad (counted, logged)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return default
    except OSError as error:
        skipped.skip(str(path), f"unreadable ({error.strerror or error})")
        return default
    try:
        return parse_record(data, check, non_finite)
    except BadInput as error:
        skipped.skip(str(path), str(error))
        return default


def answer_record(body: bytes, check: Checker, source: str, skipped: Skipped = SKIPPED, default: Any = None) -> Any:
    """An HTTP answer's record (the proxy's stats), or `default` when it is bad (counted, logged)."""
    try:
        return parse_record(body, check)
    except BadInput as error:
        skipped.skip(source, str(error))
        return default


def refusal(path: str | Path, error: BadInput, consequence: str, remedy: str) -> str:
    """The one paragraph for a file a reader must not guess past: which file, what is wrong, why it stops, and
    what to do."""
    return f"{path} cannot be read: {error}. {consequence}; {remedy}"


# The proxy's /proxy/stats answer (agrpo/proxy/metrics.py `stats`, replicas.py `describe`): the fields readers use.
PROXY_REPLICA = record(
    {"index": integer, "url": text, "healthy": flag, "hung": flag, "routed": number, "adapters": array(text)},
    required=("url",),
)
PROXY_STATS = record(
    {
        "routed": number,
        "affinity": number,
        "unmatched": number,
        "spilled": number,
        "retried": number,
        "failed": number,
        "replicas": array(PROXY_REPLICA),
    }
)

# A run's summary (agrpo/trainer/trl_backend.py writes it at the end): the fields its readers use are typed, the rest
# kept; NaN there (a diverged run's reward) reads as null rather than losing the whole summary.
RUN_METRICS = record(
    {"global_step": integer, "reward_last": signed, "reward_first": signed, "wall_time_s": number}, keep_unknown=True
)
LOG_HISTORY = array(record({}, keep_unknown=True))


def read_metrics(path: str | Path, skipped: Skipped = SKIPPED) -> dict[str, Any]:
    """A run's metrics.json ({} when there is none or it is bad: counted and logged once)."""
    return read_record(path, RUN_METRICS, skipped, default={}, non_finite="null")
