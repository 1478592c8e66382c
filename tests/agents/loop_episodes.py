"""Helpers of the tests that play episodes of agrpo's rollout loop (test_refused_turns.py against a stand-in for
vLLM, test_refused_turns_vllm.py against the real replica): a tool that answers 6 MB, and the loop's counters."""

from __future__ import annotations

HUGE = '''

def huge(query: str) -> str:
    """Return six megabytes.

    Args:
        query: Anything.
    """
    return "x" * 6_000_000
'''


def counted(loop) -> dict[str, float]:
    """The counters' totals since the last call: what the loop pushed to the trainer's metrics queue at each
    episode's end, and what is left."""
    import queue
    from collections import Counter

    totals = Counter(loop._counters)
    loop._counters.clear()
    while True:
        try:
            pushed = loop._metrics_queue.get(timeout=0.5)
        except queue.Empty:
            return totals
        totals.update({key: value for key, value in pushed.items() if isinstance(value, float)})
