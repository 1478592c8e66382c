"""Multi-turn routing counters and the run's agent figures (agrpo/agents/metrics.py), on tables of turns and on log
history entries shaped as TRL logs them (counters summed per window)."""

from __future__ import annotations

import pytest

from agrpo.agents.metrics import (
    CALLS_DONE,
    CONTINUATIONS,
    FAILURES_DONE,
    MALFORMED,
    TRUNCATED,
    EPISODES,
    NEW_ADAPTER,
    ON_PREFIX,
    ROUTED,
    TURNS,
    agent_summary,
    continuation_counts,
    summary_line,
)


@pytest.mark.parametrize(
    ("turns", "continuations", "new_adapter", "routed", "on_prefix"),
    [
        ([("v1", "0")], 0, 0, 0, 0),  # one turn: nothing continues
        ([("v1", "0"), ("v1", "0")], 1, 0, 1, 1),  # the continuation stayed with its prefix
        ([("v1", "0"), ("v1", "1")], 1, 0, 1, 0),  # it went to the other replica
        ([("v1", "0"), ("v2", "0")], 1, 1, 0, 0),  # a newer adapter: no replica holds its prefix under that name
        ([("v1", None), ("v1", None)], 1, 0, 0, 0),  # no proxy in front: the replica is unknown
        ([("v1", "1"), ("v1", "1"), ("v1", "0")], 2, 0, 2, 1),
    ],
)
def test_continuation_counts(turns, continuations, new_adapter, routed, on_prefix):
    counts = continuation_counts(turns)
    assert counts[EPISODES] == 1 and counts[TURNS] == len(turns)
    assert (counts[CONTINUATIONS], counts[NEW_ADAPTER], counts[ROUTED], counts[ON_PREFIX]) == (
        continuations,
        new_adapter,
        routed,
        on_prefix,
    )


def test_agent_summary_adds_up_the_windows():
    history = [
        {EPISODES: 16, TURNS: 20, "tools/get_secret/call_total": 4, CONTINUATIONS: 4, ROUTED: 4, ON_PREFIX: 4},
        {
            EPISODES: 16,
            TURNS: 28,
            "tools/get_secret/call_total": 12,
            "tools/get_secret/failure_total": 3,
            CONTINUATIONS: 12,
            NEW_ADAPTER: 2,
            ROUTED: 10,
            ON_PREFIX: 9,
        },
        {"train_runtime": 12.0, "reward": float("nan")},  # other entries are ignored
    ]
    figures = agent_summary(history)
    assert figures["agent/episodes"] == 32
    assert figures["agent/turns_per_episode"] == pytest.approx(48 / 32)
    assert figures["agent/tool_calls_per_episode"] == pytest.approx(16 / 32)
    assert figures["agent/tool_failure_share"] == pytest.approx(3 / 16)
    assert figures["agent/continuation_affinity"] == pytest.approx(13 / 14)
    assert figures["agent/continuations_new_adapter"] == 2
    line = summary_line(figures)
    assert "0.50 tool calls per episode (18.8% of 16 finished calls failed)" in line
    assert "continuations on the replica holding their prefix 92.9% (14 routed, 2 on a newer adapter)" in line


def test_no_episode_no_figures():
    assert agent_summary([{"reward": 0.5}]) == {}
    assert summary_line({}) == ""


def test_a_call_still_running_at_the_end_does_not_count_as_a_success():
    """Issue 32: a tool that hangs on every call, 16 calls, the last one still running when the run ended: TRL's
    counters say 15 failures of 16 calls (93.8%). agrpo's loop counts calls and failures together when each call
    ends, so the share is 100% of the 15 that ended, and the line says one was still running."""
    history = [
        {EPISODES: 8, "tools/slow/call_total": 8, "tools/slow/failure_total": 7, CALLS_DONE: 7, FAILURES_DONE: 7},
        {EPISODES: 8, "tools/slow/call_total": 8, "tools/slow/failure_total": 8, CALLS_DONE: 8, FAILURES_DONE: 8},
        {EPISODES: 0, TRUNCATED: 3, MALFORMED: 2},
    ]
    figures = agent_summary(history)
    assert figures["agent/tool_failure_share"] == 1.0 and figures["agent/tool_calls_done"] == 15
    line = summary_line(figures)
    assert "1.00 tool calls per episode (100.0% of 15 finished calls failed; 1 still running at the end)" in line
    assert "2 replies with a tool call TRL could not parse; 3 tool answers cut at agent.max_tool_output_chars" in line
