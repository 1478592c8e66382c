"""Requests in flight whose adapter version was retired are aborted: their answers could no longer be trained.

Why: the trainer unloads v(N - max_staleness - 1) once vN is served, so a sample of a retired version is more than
max_staleness versions behind the trainer and is dropped as stale when it arrives. vLLM's unload only forgets the
name; a request already inside an engine runs to its end (agrpo/trainer/sync/retention.py), so a slow replica kept
generating answers nobody could use while fresh requests queued behind them. Closing the connection makes vLLM abort
the request (it frees the slot at once); the client gets the proxy's 410 for a retired version, which agrpo's rollout
loop drops without a retry. Each abort is counted on its replica (`aborted_stale` in /proxy/stats).

The sweep runs on the routed path, at most every `SWEEP_S` (routed requests arrive many times a second while a run
trains, and a retirement happens at a weight sync), so the proxy needs no timer task of its own.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

SWEEP_S = 0.25
REASON = "its adapter version was retired while it ran (more than max_staleness versions behind): aborted"


def abort_retired(replicas: Iterable, retired: Container[str]) -> int:
    """Drop every routed request in flight that names a retired adapter; returns how many were dropped."""
    dropped = 0
    for replica in replicas:
        for exchange in list(replica.exchanges):
            if exchange.retired or exchange.model is None or exchange.model not in retired:
                continue
            exchange.retired = True
            exchange.drop(REASON)
            replica.aborted_stale += 1
            dropped += 1
    return dropped


class StaleSweep:
    """`due(now)`: whether a sweep is due (at most one every SWEEP_S)."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0.0

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + SWEEP_S
        return True
