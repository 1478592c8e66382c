"""An episode's turns -> the rows the trainer trains on (pure).

Each turn of an episode re-renders the whole conversation through the chat template, so turn k+1's prompt should
start with everything turn k saw and produced. When it does, the episode stays one row: the new part of the prompt
(the tool's answer, the next turn's header) is appended as context and the next reply as trained tokens. A template
may re-render the last reply slightly differently (a stripped space, a dropped reasoning block): a small drift inside
that reply is overwritten as context ("realign"); a larger one, or one reaching further back, starts a new row
("fork"), so no row mixes tokens the model saw with tokens it did not. TRL 1.16's rollout worker defines the same three
cases and the same threshold (`fork_threshold_tokens`); the drift tally is its observability, under TRL's figure names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl.experimental.async_grpo.async_rollout_worker import TrainingSequence


@dataclass(frozen=True)
class TurnTokens:
    """One request of an episode: the prompt it sent, the tokens it got back and their logprobs."""

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]


@dataclass
class DriftTally:
    """How the turn transitions of an episode joined: appended cleanly, realigned or forked, and by how much."""

    clean: int = 0
    realign: int = 0
    fork: int = 0
    drift_tokens: int = 0
    drift_max: int = 0

    @property
    def transitions(self) -> int:
        return self.clean + self.realign + self.fork


@dataclass
class _Row:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reply_start: int | None = None  # where the last trained reply begins

    def context(self, ids: list[int]) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def reply(self, turn: TurnTokens) -> None:
        if len(turn.output_logprobs) != len(turn.output_ids):
            raise ValueError(f"{len(turn.output_ids)} tokens came with {len(turn.output_logprobs)} logprobs")
        self.reply_start = len(self.tokens)
        self.tokens += turn.output_ids
        self.mask += [1] * len(turn.output_ids)
        self.logprobs += list(turn.output_logprobs)

    def cut_to(self, length: int) -> None:
        del self.tokens[length:], self.mask[length:], self.logprobs[length:]


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the common case, at C speed
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def rows_from_turns(
    turns: list[TurnTokens], rollout_id: str, fork_threshold: int
) -> tuple[list[TrainingSequence], DriftTally]:
    """The episode's training rows (rows without a trained token are left out) and its drift tally."""
    rows: list[_Row] = []
    tally = DriftTally()
    for turn in turns:
        row = rows[-1] if rows else None
        if row is None:
            row = _Row()
            rows.append(row)
            row.context(turn.prompt_ids)
        else:
            matched = shared_prefix(row.tokens, turn.prompt_ids)
            drift = len(row.tokens) - matched
            tally.drift_tokens += drift
            tally.drift_max = max(tally.drift_max, drift)
            if drift == 0:
                tally.clean += 1
                row.context(turn.prompt_ids[matched:])
            elif row.reply_start is not None and matched >= row.reply_start and drift < fork_threshold:
                tally.realign += 1
                row.cut_to(matched)
                row.context(turn.prompt_ids[matched:])
            else:
                tally.fork += 1
                row = _Row()
                rows.append(row)
                row.context(turn.prompt_ids)
        row.reply(turn)
    kept = [row for row in rows if any(row.mask)]
    return [TrainingSequence(r.tokens, r.mask, r.logprobs, rollout_id) for r in kept], tally
