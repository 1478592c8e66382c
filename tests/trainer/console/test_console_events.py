"""One console line per event (agrpo/trainer/console/events.py): a frozen replica's dropped groups fold into its
lines, drops outside a hang get one line, the summary's `retried` is the proxy's figure, and the rollout loop writes
each dropped group to trainer.log only. The steps are the real 60-step smoke run's (tests/report/data) with the
serving figures a frozen replica gave in the multi-replica e2e run (8 groups dropped, proxy retried 0)."""

from __future__ import annotations

import logging


from agrpo.proxy.metrics import Metrics
from agrpo.trainer.console.callback import ConsoleCallback, summary_lines
from agrpo.trainer.console.events import (
    DROPPED_LINE,
    PROXY_RETRIED,
    RETIRED_DROPPED,
    WORKER_RESENT,
    ConsoleEvents,
    requests_figures,
    requests_line,
)
from agrpo.trainer.console.serving_metrics import proxy_figures, summary_line
from tests.trainer.console.test_console import HISTORY, config, drive

HUNG_FROM, HUNG_UNTIL = 20, 30  # replica 1 SIGSTOPped at step 20, answering again at step 30


def frozen_replica(entry: dict, drops: dict[int, int]) -> dict:
    """A step of the real run as a two-replica run with replica 1 frozen over [HUNG_FROM, HUNG_UNTIL): the proxy's
    figures, and `drops[step]` groups dropped that step."""
    if "reward" not in entry:
        return entry
    hung = HUNG_FROM <= entry["step"] < HUNG_UNTIL
    figures = {"proxy/replica0/healthy": 1.0, "proxy/replica0/hung": 0.0, PROXY_RETRIED: 0.0}
    figures |= {"proxy/replica1/healthy": float(not hung), "proxy/replica1/hung": float(hung)}
    if entry["step"] in drops:
        figures[RETIRED_DROPPED] = float(drops[entry["step"]])
    return {**entry, **figures}


def console_lines(caplog) -> list[str]:
    """What the console shows of agrpo's lines (its filter: INFO and above, agrpo/trainer/console/logs.py)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("agrpo") and r.levelno >= logging.INFO]


def test_a_frozen_replica_is_two_lines_its_dropped_groups_folded_into_the_second(caplog):
    drops = {HUNG_FROM: 5, HUNG_FROM + 1: 3}  # its 8 requests in flight, answered 410 over two logging windows
    callback = ConsoleCallback(config(console_every=0, progress_bar=False), num_replicas=2)
    with caplog.at_level(logging.DEBUG, logger="agrpo"):
        drive(callback, [frozen_replica(entry, drops) for entry in HISTORY], 60)
    lines = console_lines(caplog)
    about = [line for line in lines if "replica 1" in line or "group" in line]
    assert about == [
        "replica 1 is hung (not answering its health probe): the proxy took it out of rotation, its requests and "
        "adapter syncs go to the other replicas; training goes on without it",
        f"replica 1 answers again (hung since step {HUNG_FROM}; 8 group(s) were dropped meanwhile, their adapter "
        "version retired before they finished): re-admitted with the current adapter",
    ]
    banner = [line for line in lines if line.startswith(("agrpo: training", "  "))]
    assert len(lines) == len(banner) + 2 and len(banner) == 3  # the banner and the two event lines: nothing more


def test_drops_outside_a_hang_get_one_line_then_only_counts():
    events = ConsoleEvents()
    assert events.observe({RETIRED_DROPPED: 3.0}, 5) == [(logging.INFO, DROPPED_LINE.format(n=3))]
    assert "counted in the summary" in DROPPED_LINE.format(n=3)
    assert events.observe({RETIRED_DROPPED: 2.0}, 6) == [] and events.observe({RETIRED_DROPPED: 7.0}, 40) == []
    assert events.observe({RETIRED_DROPPED: 0.0}, 41) == []


def test_drops_after_a_hang_ended_are_said_once_and_the_next_hang_counts_its_own():
    events = ConsoleEvents()
    hung = {"proxy/replica1/healthy": 0.0, "proxy/replica1/hung": 1.0}
    back = {"proxy/replica1/healthy": 1.0, "proxy/replica1/hung": 0.0}
    events.observe({**hung, RETIRED_DROPPED: 4.0}, 10)
    [(_, line)] = events.observe(back, 12)
    assert "4 group(s) were dropped meanwhile" in line
    [(_, line)] = events.observe({**back, RETIRED_DROPPED: 1.0}, 20)  # a killed replica's, say: a kind of its own
    assert line == DROPPED_LINE.format(n=1)
    events.observe(hung, 30)
    [(_, line)] = events.observe(back, 31)
    assert line == "replica 1 answers again (hung since step 30): re-admitted with the current adapter"


def test_the_summarys_retried_is_the_proxys_as_the_serving_line_says_it():
    """The proxy counts a request re-sent to another replica in `retried` (/proxy/stats); one it handed back that
    found its version retired is answered 410 and counted in `retired` instead. TRL's `rollout/vllm_retry_total`
    counts only what the rollout worker itself sent again. The summary shows each under its own name."""
    metrics = Metrics()
    metrics.retried, metrics.retired = 2, 8
    figures = proxy_figures(metrics.stats([], 0))
    history = [
        {"step": 1, WORKER_RESENT: 1.0, PROXY_RETRIED: 0.0},
        {"step": 2, RETIRED_DROPPED: 5.0, PROXY_RETRIED: 1.0},
        {"step": 3, RETIRED_DROPPED: 3.0, **figures},
    ]
    counts = requests_figures(history)
    assert counts == {"proxy_retried": 2, "worker_resent": 1, "retired_dropped": 8}
    line = requests_line(counts)
    assert line.startswith("  requests     retried 2 (by the proxy, on another replica), re-sent 1 (by the rollout ")
    assert "8 group(s) dropped (adapter version retired" in line
    assert f"retried {counts['proxy_retried']})" in summary_line(figures)  # the serving line: the same figure
    assert requests_line({"proxy_retried": 0, "worker_resent": 0, "retired_dropped": 0}) is None
    common = dict(run_dir="/r", adapter="/r/a", overrides=[], serve="vllm", base_model="m")
    with_counts = summary_lines({"steps": 3, "requests": counts}, **common)
    assert line in with_counts and len(with_counts) == len(summary_lines({"steps": 3}, **common)) + 1
