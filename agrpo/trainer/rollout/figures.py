"""The rollout child's figures for the trainer's log, in the shape TRL's public `RolloutWorkerProtocol` documents for
its `metrics_queue`: `{key: float}` for a gauge or a counter, `{key: (numerator, denominator)}` for a rate. TRL's
trainer reduces each key by its name (a `total` word is summed over the logging window, `max`/`min` are extrema,
anything else is averaged), so counters are pushed as deltas. The key names are TRL's own where TRL's worker has the
same figure (`completions/mean_length`, `rollout/turns_mean`, `tools/...`), so TRL's docs, agrpo's console
(agrpo/trainer/console/) and the curves read them alike.
"""

from __future__ import annotations

import queue
from collections import defaultdict
from typing import Any


class Figures:
    """Counters and rates gathered between pushes, and the push itself (never blocks: a full queue drops them)."""

    def __init__(self, sink: Any):
        self.sink = sink  # the metrics queue the trainer drains in `log()`
        self.counters: dict[str, float] = defaultdict(float)
        self.rates: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def count(self, key: str, amount: float = 1.0) -> None:
        self.counters[key] += amount

    def rate(self, key: str, numerator: float, denominator: float = 1.0) -> None:
        pair = self.rates[key]
        pair[0] += numerator
        pair[1] += denominator

    def push(self, values: dict[str, float] | None = None) -> None:
        """`values` (gauges, extrema) with every counter and rate gathered since the last push."""
        payload: dict[str, Any] = dict(values or {})
        payload.update(self.counters)
        payload.update({key: (num, den) for key, (num, den) in self.rates.items()})
        self.counters.clear()
        self.rates.clear()
        if not payload:
            return
        try:
            self.sink.put_nowait(payload)
        except queue.Full:
            pass
