"""Multi-turn figures, pure: what one episode's turns say about routing, and the run's totals from its log history.

A continuation turn (every turn after an episode's first) extends the previous turn's prompt and completion, whose KV
blocks sit on the replica that served that turn. It can reuse them only there, and only under the same adapter name
(vLLM keys its prefix cache by adapter). So each continuation is counted as: on a newer adapter version than the
previous turn (no replica holds its prefix under that name), routed with both replicas known (through agrpo's
proxy, which names the replica in `X-Agrpo-Replica`), and of those, served by the same replica as the previous turn.
Keys containing `total` are summed per logging window by TRL, so the log history carries exact counts.
"""

from __future__ import annotations

from typing import Any

from agrpo.agents.malformed import REASONS, reason_key, reasons_part

EPISODES = "agent/episodes_total"
TURNS = "agent/turns_total"
CONTINUATIONS = "agent/continuations_total"
NEW_ADAPTER = "agent/continuations_new_adapter_total"
ROUTED = "agent/continuations_routed_total"
ON_PREFIX = "agent/continuations_on_prefix_replica_total"
AFFINITY_RATE = "agent/continuation_affinity"  # (on the prefix's replica, routed) per window: TRL logs the ratio
CALLS_DONE = "agent/tool_calls_done_total"  # tool calls that returned or failed (TRL counts a call when it starts)
FAILURES_DONE = "agent/tool_failures_done_total"  # of those, the failed ones: counted together, so the share is exact
TRUNCATED = "tools/truncated_total"  # tool answers cut at agent.max_tool_output_chars
MALFORMED = "tools/malformed_call_total"  # replies that open a tool call TRL cannot parse (read as plain text)
CONTEXT_FULL_COUNTER = "rollout/context_full_total"  # later turns refused as too long: their episode ended there
REFUSED_COUNTER = "rollout/refused_turns_total"  # later turns refused otherwise: their episode ended there


def continuation_counts(turns: list[tuple[str | None, str | None]]) -> dict[str, float]:
    """Counters for one episode from its turns in order, each (adapter name requested, replica that served it)."""
    counts = {
        EPISODES: 1.0,
        TURNS: float(len(turns)),
        CONTINUATIONS: 0.0,
        NEW_ADAPTER: 0.0,
        ROUTED: 0.0,
        ON_PREFIX: 0.0,
    }
    for (previous_model, previous_replica), (model, replica) in zip(turns, turns[1:]):
        counts[CONTINUATIONS] += 1
        if model != previous_model:
            counts[NEW_ADAPTER] += 1
        elif previous_replica is not None and replica is not None:
            counts[ROUTED] += 1
            counts[ON_PREFIX] += float(previous_replica == replica)
    return counts


def _sum(log_history: list[dict[str, Any]], predicate) -> float:
    return sum(
        float(value)
        for entry in log_history
        for key, value in entry.items()
        if predicate(key) and isinstance(value, (int, float)) and value == value  # NaN-free
    )


def agent_summary(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The run's agent figures from the trainer's log history (empty when no episode was logged)."""
    episodes = _sum(log_history, lambda key: key == EPISODES)
    if not episodes:
        return {}
    calls = _sum(log_history, lambda key: key.startswith("tools/") and key.endswith("/call_total"))
    failures = _sum(log_history, lambda key: key.startswith("tools/") and key.endswith("/failure_total"))
    done = _sum(log_history, lambda key: key == CALLS_DONE)
    if done or any(CALLS_DONE in entry for entry in log_history):  # agrpo's loop: calls and failures counted together
        failures = _sum(log_history, lambda key: key == FAILURES_DONE)
    else:
        done = calls
    routed = _sum(log_history, lambda key: key == ROUTED)
    figures = {
        "agent/episodes": episodes,
        "agent/turns_per_episode": _sum(log_history, lambda key: key == TURNS) / episodes,
        "agent/tool_calls_per_episode": calls / episodes,
        "agent/tool_calls": calls,
        "agent/tool_failures": failures,
        "agent/tool_calls_done": done,
        "agent/tool_calls_cut": _sum(log_history, lambda key: key == TRUNCATED),
        "agent/tool_calls_malformed": _sum(log_history, lambda key: key == MALFORMED),
        **{reason_key(r): _sum(log_history, lambda key, r=r: key == reason_key(r)) for r in REASONS},
        "agent/continuations": _sum(log_history, lambda key: key == CONTINUATIONS),
        "agent/continuations_new_adapter": _sum(log_history, lambda key: key == NEW_ADAPTER),
        "agent/continuations_routed": routed,
    }
    if done:
        figures["agent/tool_failure_share"] = failures / done  # of the calls that ended (a hung one may not have)
    if routed:
        figures["agent/continuation_affinity"] = _sum(log_history, lambda key: key == ON_PREFIX) / routed
    return figures


def summary_line(figures: dict[str, float]) -> str:
    """One line for the end of a run."""
    if not figures:
        return ""
    failed = ""
    if "agent/tool_failure_share" in figures:
        done, calls = int(figures.get("agent/tool_calls_done", 0)), int(figures["agent/tool_calls"])
        running = f"; {calls - done} still running at the end" if calls > done else ""
        failed = f" ({figures['agent/tool_failure_share']:.1%} of {done} finished calls failed{running})"
    parts = [
        f"{figures['agent/tool_calls_per_episode']:.2f} tool calls per episode{failed}",
        f"{figures['agent/turns_per_episode']:.2f} turns per episode over {int(figures['agent/episodes'])} episodes",
    ]
    odd = [
        f"{int(figures.get(key, 0))} {what}"
        for key, what in (
            ("agent/tool_calls_malformed", f"replies with a tool call TRL could not parse{reasons_part(figures)}"),
            ("agent/tool_calls_cut", "tool answers cut at agent.max_tool_output_chars"),
        )
        if figures.get(key)
    ]
    parts += odd
    if "agent/continuation_affinity" in figures:
        parts.append(
            f"continuations on the replica holding their prefix {figures['agent/continuation_affinity']:.1%} "
            f"({int(figures['agent/continuations_routed'])} routed, "
            f"{int(figures['agent/continuations_new_adapter'])} on a newer adapter)"
        )
    return "; ".join(parts)
