"""Routing with each replica's measured pace (issue 47): the pure pieces, without sockets."""

import random

import pytest

from agrpo.proxy.metrics import Metrics
from agrpo.proxy.pace import HALF_LIFE_S, MIN_ANSWERS, Pace, relative_paces
from agrpo.proxy.pool import Exchange
from agrpo.proxy.replicas import Replica
from agrpo.proxy.routing import AFFINITY, COLD, Router
from agrpo.proxy.stale_abort import SWEEP_S, StaleSweep, abort_retired
from tests.proxy.test_proxy_routing import req


def measured(rate: float, answers: int = 8) -> Pace:
    """A pace that saw `answers` requests of 100 work units, one after the other, at `rate` units per second."""
    pace, now = Pace(), 0.0
    for _ in range(answers):
        pace.begin(now)
        now += 100 / rate
        pace.end(100, now)
    return pace


def test_pace_is_work_over_busy_seconds_and_idle_time_does_not_count():
    pace, now = Pace(), 0.0
    for _ in range(MIN_ANSWERS):
        pace.begin(now)
        pace.begin(now)  # two at once: the busy second counts once
        now += 1.0
        pace.end(50, now)
        pace.end(50, now)
        now += 30.0  # idle: not busy time
    assert pace.rate == pytest.approx(100.0, rel=0.01)


def test_pace_is_unknown_until_enough_answers_and_failed_work_does_not_count():
    pace = Pace()
    for i in range(MIN_ANSWERS - 1):
        pace.begin(float(i))
        pace.end(100, i + 1.0)
    assert pace.rate is None
    pace.begin(10.0)
    pace.end(100, 11.0, answered=False)  # aborted: its busy second counts, its work does not
    assert pace.rate is None
    pace.begin(11.0)
    pace.end(100, 12.0)
    assert pace.rate == pytest.approx(400 / 5, rel=0.05)


def test_a_replica_that_slows_down_is_seen_within_a_few_half_lives():
    pace = measured(rate=400.0, answers=40)
    now = 1000.0
    while now < 1000.0 + 4 * HALF_LIFE_S:  # now a quarter of the pace
        pace.begin(now)
        now += 1.0
        pace.end(100, now)
    assert pace.rate < 150.0  # from 400 towards 100


def test_relative_paces_put_the_fastest_and_the_unmeasured_at_one():
    assert relative_paces({0: 400.0, 1: 100.0, 2: None}) == {0: 1.0, 1: 0.25, 2: 1.0}
    assert relative_paces({0: None, 1: None}) == {0: 1.0, 1: 1.0}


def test_equal_or_unknown_paces_route_exactly_as_the_work_balanced_policy():
    rng = random.Random(7)
    plain, paced = Router(), Router()
    loads_a = {0: 0.0, 1: 0.0, 2: 0.0}
    loads_b = dict(loads_a)
    for _ in range(300):
        request = req([rng.randrange(50)] * 20, max_tokens=rng.choice([16, 64]))
        a = plain.route(request, loads_a)
        b = paced.route(request, loads_b, {0: 1.0, 1: 1.0, 2: 1.0})
        assert (a.replica, a.kind) == (b.replica, b.kind)
        finished = rng.randrange(3)
        for loads, d in ((loads_a, a), (loads_b, b)):
            loads[d.replica] += d.work
            loads[finished] *= 0.5  # some work finishes


def drained(paces: dict[int, float] | None, groups: int = 400, group_size: int = 4) -> tuple[dict, dict]:
    """Groups of rollouts routed while each replica works through its queue at its true pace (1.0 and 0.25): the
    requests each replica got, and the mean time its queue took to drain (what a request waited, in ticks). The
    router is told the paces, or not (None)."""
    true_pace = {0: 1.0, 1: 0.25}
    router, loads, got, waited = Router(), {0: 0.0, 1: 0.0}, {0: 0, 1: 0}, {0: 0.0, 1: 0.0}
    for g in range(groups):
        for _ in range(group_size):
            d = router.route(req([g % 97, g] * 10, max_tokens=16), loads, paces)
            loads[d.replica] += d.work
            got[d.replica] += 1
            waited[d.replica] += loads[d.replica] / true_pace[d.replica]
        for r in loads:  # between groups, each replica works through its queue at its own pace
            loads[r] = max(0.0, loads[r] - 100.0 * true_pace[r])
    return got, {r: waited[r] / max(got[r], 1) for r in got}


def test_a_quarter_pace_replica_gets_a_fifth_of_the_requests_and_returns_them_as_fresh():
    (_, plain_wait), (paced_got, paced_wait) = drained(None), drained({0: 1.0, 1: 0.25})
    assert plain_wait[1] > 2 * plain_wait[0]  # work-balanced: the straggler's answers come back much later
    share = paced_got[1] / sum(paced_got.values())
    assert 0.1 <= share <= 0.3, paced_got  # in proportion to its pace (1 : 0.25 -> 20%)
    assert paced_wait[1] < 1.5 * paced_wait[0], paced_wait  # its answers about as fresh as the fast replica's


def test_a_group_stays_together_on_the_replica_that_finishes_first():
    router = Router()
    loads, paces = {0: 40.0, 1: 0.0}, {0: 1.0, 1: 0.25}
    kinds = []
    for _ in range(4):
        d = router.route(req([3, 4, 5] * 10), loads, paces)
        loads[d.replica] += d.work
        kinds.append((d.replica, d.kind))
    # idle but four times slower: 46 work units take it 184 of the fast replica's; the fast one is done in 86
    assert kinds == [(0, COLD)] + [(0, AFFINITY)] * 3


def test_stale_requests_in_flight_are_aborted_and_counted_on_their_replica():
    slow, fast = Replica(index=1, url="http://slow"), Replica(index=0, url="http://fast")
    old = Exchange(None, slow, 60.0, model="trl-policy-v1")
    fresh = Exchange(None, slow, 60.0, model="trl-policy-v3")
    other = Exchange(None, fast, 60.0, model="trl-policy-v2")
    slow.exchanges |= {old, fresh}
    fast.exchanges.add(other)
    assert abort_retired([fast, slow], {"trl-policy-v1"}) == 1
    assert (old.retired, fresh.retired, other.retired) == (True, False, False)
    assert (slow.aborted_stale, fast.aborted_stale) == (1, 0)
    assert abort_retired([fast, slow], {"trl-policy-v1"}) == 0  # once


def test_the_sweep_runs_at_most_once_per_interval():
    sweep = StaleSweep()
    assert sweep.due(100.0) and not sweep.due(100.0 + SWEEP_S / 2) and sweep.due(100.0 + SWEEP_S)


def test_stats_show_each_replicas_pace_and_shares_of_requests_and_late_answers():
    fast, slow = Replica(index=0, url="http://fast"), Replica(index=1, url="http://slow")
    fast.routed, slow.routed, fast.late, slow.late, slow.aborted_stale = 80, 20, 1, 2, 1
    fast.pace, slow.pace = measured(400.0), measured(100.0)
    stats = Metrics().stats([fast, slow], tracked=0)
    rows = {r["index"]: r for r in stats["replicas"]}
    assert rows[0]["routed_share"] == 0.8 and rows[1]["routed_share"] == 0.2
    assert rows[0]["stale_share"] == 0.25 and rows[1]["stale_share"] == 0.75  # late answers + aborted requests
    assert rows[0]["pace_work_per_s"] == pytest.approx(400.0) and rows[1]["pace_work_per_s"] == pytest.approx(100.0)
    text = Metrics().prometheus([fast, slow], tracked=0)
    assert 'agrpo_proxy_replica_late_total{replica="1",url="http://slow"} 2.0' in text


def test_an_answer_has_until_the_next_version_is_collected():
    from agrpo.proxy.deadline import Deadlines

    deadlines = Deadlines()
    assert deadlines.time_left("trl-policy-v1", 0.0) is None  # nothing measured yet
    for version in range(1, 6):  # a version every 0.5 s, each retired two versions later (max_staleness 1)
        deadlines.seen(f"trl-policy-v{version}", 0.5 * version)
        deadlines.seen(f"trl-policy-v{version}", 0.5 * version + 0.2)  # its later requests change nothing
        deadlines.sweep({f"trl-policy-v{v}" for v in range(1, version - 1)}, 0.5 * version)
    # v5 first seen at 2.5 s, lifetime 1.0 s, interval 0.5 s: in time until 3.0 s
    assert deadlines.time_left("trl-policy-v5", 2.6) == pytest.approx(0.4)
    assert deadlines.time_left("alice/trl-policy-v5", 2.6) is None  # another series: its own clock


def test_a_replica_that_would_answer_too_late_is_left_out_unless_every_one_would():
    from agrpo.proxy.deadline import PROBE_AFTER_S, late_replicas

    fast, slow = Replica(index=0, url="http://fast"), Replica(index=1, url="http://slow")
    for replica, took in ((fast, 0.3), (slow, 1.5)):
        replica.begin(50, 10.0)
        replica.end(50, 10.0 + took, took_s=took)
        replica.begin(50, 12.0)  # busy: judged on its answers
    replicas = {0: fast, 1: slow}
    loads = {0: 100.0, 1: 10.0}
    assert late_replicas(loads, replicas, 0.8, 12.0) == {1}
    assert late_replicas(loads, replicas, None, 12.0) == set()  # unknown deadline: everyone
    assert late_replicas(loads, replicas, 0.1, 12.0) == set()  # nobody in time: routing as before
    slow.end(50, 12.5, answered=False)  # idle now, its last answer long ago: probed again
    assert late_replicas(loads, replicas, 0.8, 12.0 + PROBE_AFTER_S + 1.0) == set()


def test_replicas_of_one_pace_are_not_split_by_a_deadline_their_answer_times_straddle():
    from agrpo.proxy.deadline import SLOWER_BY, late_replicas

    first, second = Replica(index=0, url="http://a"), Replica(index=1, url="http://b")
    for replica, took in ((first, 1.0), (second, 1.0 * SLOWER_BY - 0.1)):
        replica.begin(50, 10.0)
        replica.end(50, 10.0 + took, took_s=took)
        replica.begin(50, 12.0)
    loads = {0: 10.0, 1: 10.0}
    assert late_replicas(loads, {0: first, 1: second}, 1.2, 12.0) == set()  # 1.4 s is late, no slower than its peer
    second.end(50, 12.0 + SLOWER_BY + 0.1, took_s=(SLOWER_BY + 0.1) / 0.25 - 3 * 1.4)  # its average: past 1.5 x 1.0
    second.begin(50, 14.0)
    assert second.pace.latency_s > SLOWER_BY * first.pace.latency_s
    assert late_replicas(loads, {0: first, 1: second}, 1.2, 14.0) == {1}


def test_a_late_replica_keeps_the_continuations_it_holds_but_no_cold_request_nor_pinned_group():
    from agrpo.proxy.prompts import Prompt
    from agrpo.proxy.request_fields import RoutingFields
    from agrpo.proxy.routing import AFFINITY, COLD, SPILL, Router

    def request(ids):
        return RoutingFields(model="trl-policy-v3", prompts=[Prompt.from_token_ids(ids)], n=1, max_tokens=16)

    router, loads = Router(), {0: 0.0, 1: 0.0}
    first = list(range(1000, 1040))
    assert router.route(request(first), loads).replica == 0  # cold, ties to the lower index: replica 0 holds it
    continuation = first + [77] * 20 + [88]
    decision = router.route(request(continuation), loads, late={0})
    assert (decision.replica, decision.kind) == (0, AFFINITY)  # its KV blocks are on 0: it stays
    decision = router.route(request(first), loads, late={0})  # a sibling of the first prompt's group
    assert (decision.replica, decision.kind) == (1, SPILL)
    decision = router.route(request(list(range(2000, 2040))), loads, late={1})
    assert (decision.replica, decision.kind) == (0, COLD)
    decision = router.route(request(list(range(3000, 3040))), loads, late={0, 1})  # every one late: as before
    assert decision.kind == COLD
