"""Helpers of the tests that play episodes of agrpo's rollout loop (test_refused_turns.py and test_context_guard.py
against a stand-in for vLLM, test_refused_turns_vllm.py against the real replica): a tool that answers 6 MB, and the
loop's counters."""

from __future__ import annotations

import queue
from collections import Counter

HUGE = '''

def huge(query: str) -> str:
    """Return six megabytes.

    Args:
        query: Anything.
    """
    return "x" * 6_000_000
'''


def counted(loop) -> Counter:
    """The counters' totals since the last call: what the loop's figures pushed to the trainer's metrics queue (at
    each episode's end), and what they still hold."""
    totals = Counter(loop.figures.counters)
    loop.figures.counters.clear()
    while True:
        try:
            pushed = loop.figures.sink.get_nowait()
        except queue.Empty:
            return totals
        totals.update({key: value for key, value in pushed.items() if isinstance(value, float)})
