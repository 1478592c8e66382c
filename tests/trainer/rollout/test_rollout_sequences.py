"""An episode's turns -> training rows (agrpo/trainer/rollout/sequences.py), agrpo's own code for the rules TRL 1.16's
worker defines (clean append, realign a drifted last reply, fork past `fork_threshold_tokens`): the same rows and the
same drift tally as TRL's own reconciler on 600 random episodes (TRL's private `_chain_to_sequences` is the oracle
here, in a test only: agrpo's code does not call it), and the three cases by hand."""

from __future__ import annotations

import random

import pytest
from trl.experimental.async_grpo import async_rollout_worker as trl_worker

from agrpo.trainer.rollout.sequences import TurnTokens, rows_from_turns, shared_prefix


def turn(prompt, output):
    return TurnTokens(list(prompt), list(output), [-0.1 * (i + 1) for i in range(len(output))])


def random_episode(rng: random.Random) -> list[TurnTokens]:
    held = [rng.randrange(50) for _ in range(rng.randrange(1, 8))]
    turns = []
    for _ in range(rng.randrange(1, 6)):
        output = [rng.randrange(50) for _ in range(rng.randrange(0, 6))]
        turns.append(turn(held, output))
        held = held + output
        kind = rng.choice(["clean", "clean", "realign", "rewrite", "shorter"])
        if kind == "realign" and output:  # the last reply re-rendered slightly differently
            cut = len(held) - rng.randrange(1, len(output) + 1)
            held = held[:cut] + [99] * rng.randrange(0, 3)
        elif kind == "rewrite":  # history rewritten further back
            held = held[: rng.randrange(0, len(held) + 1)] + [98]
        elif kind == "shorter":
            held = held[: max(0, len(held) - rng.randrange(0, 4))]
        held = held + [rng.randrange(50) for _ in range(rng.randrange(0, 4))]  # the tool answer, the next header
    return turns


@pytest.mark.parametrize("threshold", [1, 2, 1024])
def test_the_same_rows_and_tally_as_trls_reconciler(threshold):
    rng = random.Random(threshold)
    seen = {"clean": 0, "realign": 0, "fork": 0}
    for _ in range(200):
        turns = random_episode(rng)
        records = [trl_worker.TurnRecord(t.prompt_ids, t.output_ids, t.output_logprobs) for t in turns]
        theirs, their_tally = trl_worker._chain_to_sequences(records, "r", threshold)
        ours, tally = rows_from_turns(turns, "r", threshold)
        assert [(s.input_ids, s.completion_mask, s.old_log_probs) for s in ours] == [
            (s.input_ids, s.completion_mask, s.old_log_probs) for s in theirs
        ]
        assert (tally.clean, tally.realign, tally.fork, tally.transitions) == (
            their_tally["clean"],
            their_tally["realign"],
            their_tally["fork"],
            their_tally["transitions"],
        )
        assert (tally.drift_tokens, tally.drift_max) == (their_tally["drift_tokens"], their_tally["drift_max"])
        seen = {kind: n + getattr(tally, kind) for kind, n in seen.items()}
    assert seen["clean"] > 50 and seen["fork"] > 20 and (seen["realign"] > 20 or threshold == 1)  # every case met


def test_clean_realign_and_fork_by_hand():
    rows, tally = rows_from_turns([turn([1, 2], [3, 4]), turn([1, 2, 3, 4, 5], [6])], "r", 8)
    assert rows[0].input_ids == [1, 2, 3, 4, 5, 6] and rows[0].completion_mask == [0, 0, 1, 1, 0, 1]
    assert rows[0].old_log_probs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.1] and tally.clean == 1

    rows, tally = rows_from_turns([turn([1, 2], [3, 4]), turn([1, 2, 3, 7], [6])], "r", 8)  # the reply's 4 -> 7
    assert rows[0].input_ids == [1, 2, 3, 7, 6] and rows[0].completion_mask == [0, 0, 1, 0, 1] and tally.realign == 1

    rows, tally = rows_from_turns([turn([1, 2], [3, 4]), turn([9, 2, 3, 4], [6])], "r", 8)  # the prompt rewritten
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4], [9, 2, 3, 4, 6]] and tally.fork == 1

    rows, _ = rows_from_turns([turn([1, 2], [])], "r", 8)
    assert rows == []  # nothing trained: no row


def test_shared_prefix():
    assert (
        shared_prefix([1, 2, 3], [1, 2, 4]) == 2
        and shared_prefix([1, 2], [1, 2, 3]) == 2
        and shared_prefix([], [1]) == 0
    )
