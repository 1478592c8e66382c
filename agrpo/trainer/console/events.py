"""What happens to the serving side during training, on the console: one line per kind of event, the repeats counted
(docs/console.md, "One line per event").

A frozen replica used to give 9 lines: its own, then one `dropping group N: adapter version retired (HTTP 410)` for
each of the 8 requests it held, whose version had been retired by the time the proxy gave up on it. Now:

- a replica the proxy finds hung (SIGSTOPped, a stuck host): one line when it leaves rotation, one when it answers
  again, which says how many groups were dropped meanwhile;
- groups dropped because their adapter version was retired (agrpo/trainer/rollout/loop.py; each one is a line in
  trainer.log): one line the first time it happens outside a hang, then nothing on the console;
- every count is in the end summary (`requests_figures`, `requests_line`), under the names of who counted it: the
  proxy's `retried` (/proxy/stats, the figure the `serving:` line and /metrics show too), the rollout worker's
  re-sent requests (`rollout/vllm_retry_total`, TRL's name, counted by rollout/client.py, which never sees the
  proxy's own retries) and the dropped groups.

Pure: `ConsoleEvents.observe` takes one logged step and returns the lines to print; the callback prints them.
"""

from __future__ import annotations

import logging
from typing import Any

PROXY_RETRIED = "proxy/retried"  # cumulative: routed requests the proxy re-sent to another replica
WORKER_RESENT = "rollout/vllm_retry_total"  # per logging window: requests the rollout worker sent again
RETIRED_DROPPED = "rollout/retired_dropped_total"  # per logging window: groups dropped, their version retired

DROPPED_LINE = (
    "dropped {n} group(s) of rollouts: their adapter version was retired (HTTP 410) before they finished, more than "
    "trainer.max_staleness behind, so the trainer would have dropped them as stale anyway; further drops are "
    "written to trainer.log only and counted in the summary"
)


def hung_indices(logs: dict[str, Any]) -> dict[int, bool]:
    """replica -> whether the proxy calls it hung now (`proxy/replicaN/hung`), for every replica the step reports."""
    found = {}
    for key, value in logs.items():
        if key.startswith("proxy/replica") and key.endswith("/hung"):
            found[int(key[len("proxy/replica") : -len("/hung")])] = bool(value)
    return found


def hung_line(index: int) -> str:
    return (
        f"replica {index} is hung (not answering its health probe): the proxy took it out of rotation, its requests "
        "and adapter syncs go to the other replicas; training goes on without it"
    )


def back_line(index: int, since: int, dropped: int) -> str:
    meanwhile = (
        f"; {dropped} group(s) were dropped meanwhile, their adapter version retired before they finished"
        if dropped
        else ""
    )
    return f"replica {index} answers again (hung since step {since}{meanwhile}): re-admitted with the current adapter"


class ConsoleEvents:
    """The serving side's events over a run (see the module docstring). A replica that died gets no line here: it
    refuses connections rather than hanging, and the launcher prints its own ("vllm-1 died; restarting it")."""

    def __init__(self) -> None:
        self.hung: dict[int, int] = {}  # replica -> the step it was first seen hung
        self.dropped_while_hung = 0  # groups dropped since the first of the hung replicas left rotation
        self.said_dropped = False

    def observe(self, logs: dict[str, Any], step: int) -> list[tuple[int, str]]:
        """The (level, line) pairs one logged step gives: hangs first, then drops (folded into a hang's line when a
        replica is hung: the drops are its requests), then replicas back in rotation."""
        lines: list[tuple[int, str]] = []
        now_hung = hung_indices(logs)
        for index, hung in sorted(now_hung.items()):
            if hung and index not in self.hung:
                self.hung[index] = step
                lines.append((logging.WARNING, hung_line(index)))
        dropped = int(logs.get(RETIRED_DROPPED) or 0)
        if dropped and self.hung:
            self.dropped_while_hung += dropped
        elif dropped and not self.said_dropped:
            self.said_dropped = True
            lines.append((logging.INFO, DROPPED_LINE.format(n=dropped)))
        for index in sorted(self.hung):
            if logs.get(f"proxy/replica{index}/healthy") and not now_hung.get(index):
                since = self.hung.pop(index)
                lines.append((logging.INFO, back_line(index, since, self.dropped_while_hung)))
                self.dropped_while_hung = 0
        return lines


def requests_figures(history: list[dict[str, Any]]) -> dict[str, int]:
    """The run's request counts from its log history: the proxy's retries (its cumulative figure, last seen), the
    rollout worker's re-sent requests and the dropped groups (per-window counters, summed)."""
    proxy = [e[PROXY_RETRIED] for e in history if e.get(PROXY_RETRIED) is not None]
    return {
        "proxy_retried": int(proxy[-1]) if proxy else 0,
        "worker_resent": int(sum(float(e.get(WORKER_RESENT) or 0) for e in history)),
        "retired_dropped": int(sum(float(e.get(RETIRED_DROPPED) or 0) for e in history)),
    }


def requests_line(figures: dict[str, int]) -> str | None:
    """The summary's line for them, when any is not zero. `retried` is the proxy's own count, as the `serving:`
    line and /proxy/stats say it."""
    if not any(figures.values()):
        return None
    return (
        f"  requests     retried {figures['proxy_retried']} (by the proxy, on another replica), re-sent "
        f"{figures['worker_resent']} (by the rollout worker), {figures['retired_dropped']} group(s) dropped "
        "(adapter version retired; each in trainer.log)"
    )
