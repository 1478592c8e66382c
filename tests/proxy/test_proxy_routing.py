"""The pure routing policy, without sockets."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agrpo.proxy.prompts import Prompt
from agrpo.proxy.request_fields import RoutingFields
from agrpo.proxy.routing import AFFINITY, COLD, SPILL, Router

SYSTEM = list(range(1000, 1048))  # exactly three blocks of shared template


def req(ids, model="trl-policy-v3", n=1, max_tokens=16) -> RoutingFields:
    prompts = (
        [Prompt.from_token_ids(p) for p in ids] if ids and isinstance(ids[0], list) else [Prompt.from_token_ids(ids)]
    )
    return RoutingFields(model=model, prompts=prompts, n=n, max_tokens=max_tokens)


def text_req(text, model="trl-policy-v3") -> RoutingFields:
    return RoutingFields(model=model, prompts=[Prompt.from_text(text)], max_tokens=16)


def route_all(router, requests, loads):
    """Route requests that are all in flight together; return (replica, kind) pairs."""
    out = []
    for r in requests:
        d = router.route(r, loads)
        loads[d.replica] += d.work
        out.append((d.replica, d.kind))
    return out


def test_group_arriving_at_once_lands_together_with_one_cold():
    router = Router()
    loads = {0: 0.0, 1: 0.0, 2: 0.0}
    got = route_all(router, [req(SYSTEM + [5, 6, 7])] * 8, loads)
    assert {r for r, _ in got} == {got[0][0]}
    assert [k for _, k in got] == [COLD] + [AFFINITY] * 7


def test_prompt_specific_part_shorter_than_one_block_still_separates_groups():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    a = route_all(router, [req(SYSTEM + [1])] * 4, loads)
    b = route_all(router, [req(SYSTEM + [2])] * 4, loads)
    assert len({r for r, _ in a}) == 1 and len({r for r, _ in b}) == 1
    assert a[0][0] != b[0][0]  # the second group is cold and goes to the idle replica
    assert b[0][1] == COLD


def test_shared_template_is_not_affinity():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    kinds = [router.route(req(SYSTEM + list(range(g * 50, g * 50 + 40))), loads).kind for g in range(10)]
    assert kinds == [COLD] * 10


def test_adapter_name_seeds_the_hashes():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    assert router.route(req(SYSTEM, model="trl-policy-v3"), loads).kind == COLD
    assert router.route(req(SYSTEM, model="trl-policy-v4"), loads).kind == COLD
    assert router.route(req(SYSTEM, model="trl-policy-v4"), loads).kind == AFFINITY


def test_load_is_prompt_tokens_plus_max_tokens_times_n():
    router = Router()
    assert router.work(req([1, 2, 3], n=4, max_tokens=10)) == 3 + 40
    assert router.work(req([[1, 2], [3, 4, 5]], n=2, max_tokens=10)) == 5 + 2 * 2 * 10
    assert router.work(text_req("abcdefgh")) == 2 + 16  # 4 characters per token
    # a cold request goes to the replica with the least outstanding work, not the fewest requests
    assert router.route(req([9, 9]), {0: 500.0, 1: 100.0, 2: 300.0}).replica == 1


def test_spill_beyond_load_bound_and_the_rest_of_the_group_follows():
    router = Router(spill_factor=1.5, spill_slack_requests=1.0)
    loads = {0: 0.0, 1: 0.0}
    first = router.route(req(SYSTEM + [1]), loads)
    loads[first.replica] = 10_000.0  # its replica got swamped meanwhile
    second = router.route(req(SYSTEM + [1]), loads)
    assert (second.kind, second.replica) == (SPILL, 1 - first.replica)
    loads[second.replica] += second.work
    third = router.route(req(SYSTEM + [1]), loads)  # with 2 replicas: follow, do not bounce
    assert (third.kind, third.replica) == (AFFINITY, second.replica)


def test_no_spill_within_the_bound():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    got = route_all(router, [req(SYSTEM + [3])] * 16, loads)
    assert {k for _, k in got[1:]} == {AFFINITY}


def test_unavailable_pinned_replica_spills_to_a_healthy_one():
    router = Router()
    first = router.route(req([1, 2, 3]), {0: 0.0, 1: 0.0})
    other = 1 - first.replica
    again = router.route(req([1, 2, 3]), {other: 0.0})
    assert (again.replica, again.kind) == (other, SPILL)


def test_multi_turn_continuation_returns_to_the_producing_replica():
    router = Router()
    loads = {0: 0.0, 1: 0.0, 2: 0.0}
    prompts = [SYSTEM + [g, g + 1, g + 2] for g in range(3)]
    placed = {}
    for p in prompts:
        d = router.route(req(p), loads)
        loads[d.replica] += d.work
        placed[tuple(p)] = d.replica
    assert len(set(placed.values())) == 3
    for p in prompts:  # previous prompt + completion + new user turn
        turn2 = p + [77] * 37 + [88, 89]
        d = router.route(req(turn2), loads)
        assert (d.replica, d.kind) == (placed[tuple(p)], AFFINITY)
        turn3 = turn2 + [55] * 20 + [66]
        d3 = router.route(req(turn3), loads)
        assert (d3.replica, d3.kind) == (placed[tuple(p)], AFFINITY)


def test_chat_continuation_uses_the_conversation_prefix():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    base = "system\x1fYou solve math.\x1euser\x1fWhat is 2+2?\x1e"
    router.route(text_req("warm up"), loads)
    d = router.route(text_req(base), loads)
    cont = router.route(text_req(base + "assistant\x1f4\x1euser\x1fAnd 3+3?\x1e"), loads)
    assert (cont.replica, cont.kind) == (d.replica, AFFINITY)


def test_prompt_continued_by_many_different_prompts_is_a_template():
    router = Router(template_fanout=4)
    loads = {0: 0.0, 1: 0.0}
    router.route(req(SYSTEM), loads)  # someone sent the bare system prompt once
    kinds = [router.route(req(SYSTEM + [g] * 20), loads).kind for g in range(8)]
    assert kinds == [AFFINITY] * 4 + [COLD] * 4


def test_batched_prompts_pin_every_member():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    first = router.route(req([[1, 2], [3, 4]]), loads)
    assert router.route(req([3, 4]), {0: 0.0, 1: 0.0}).replica == first.replica
    assert router.route(req([1, 2]), {0: 0.0, 1: 0.0}).kind == AFFINITY


def test_memory_is_bounded_by_the_lru_and_recent_prompts_survive():
    router = Router(lru_size=100)
    loads = {0: 0.0, 1: 0.0}
    for g in range(500):
        router.route(req(SYSTEM + [g]), loads)
    assert router.tracked <= 100
    assert router.route(req(SYSTEM + [499]), loads).kind == AFFINITY
    assert router.route(req(SYSTEM + [0]), loads).kind == COLD


def test_forget_adapters_drops_their_state_only():
    router = Router()
    loads = {0: 0.0, 1: 0.0}
    router.route(req([1, 2, 3], model="v1"), loads)
    router.route(req([1, 2, 3], model="v2"), loads)
    assert router.forget_adapters(["v1", "unknown"]) > 0
    assert router.adapters() == ["v2"]
    assert router.route(req([1, 2, 3], model="v1"), loads).kind == COLD
    assert router.route(req([1, 2, 3], model="v2"), loads).kind == AFFINITY


def test_no_replica_raises():
    import pytest

    from agrpo.proxy.routing import NoReplica

    with pytest.raises(NoReplica):
        Router().route(req([1]), {})


def test_equal_loads_take_turns():
    router = Router()
    got = [router.route(req([g, 1, 2]), {0: 0.0, 1: 0.0, 2: 0.0}).replica for g in range(6)]
    assert sorted(got) == [0, 0, 1, 1, 2, 2]


def _random_concurrency(router, rng, groups, group_size, replicas, specific):
    """Route G-sized groups with arrivals and completions interleaved at random."""
    loads = {i: 0.0 for i in range(replicas)}
    prompts = [SYSTEM + [rng.randrange(50_000) for _ in range(specific)] + [g] for g in range(groups)]
    max_tokens = [rng.randrange(1, 512) for _ in range(groups)]  # one per group, as in GRPO
    pending = [g for g in range(groups) for _ in range(group_size)]
    rng.shuffle(pending)
    inflight, where, kinds = [], {}, {}
    while pending or inflight:
        if pending and (not inflight or rng.random() < 0.6):
            g = pending.pop()
            d = router.route(req(prompts[g], max_tokens=max_tokens[g]), loads)
            loads[d.replica] += d.work
            inflight.append(d)
            where.setdefault(g, set()).add(d.replica)
            kinds.setdefault(g, []).append(d.kind)
        else:
            d = inflight.pop(rng.randrange(len(inflight)))
            loads[d.replica] -= d.work
    return where, kinds


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    groups=st.integers(1, 24),
    group_size=st.integers(2, 9),
    replicas=st.integers(2, 4),
    specific=st.integers(1, 40),
)
def test_groups_stay_together_under_random_concurrency(seed, groups, group_size, replicas, specific):
    """Without spills: any interleaving puts each group on one replica with one cold request."""
    where, kinds = _random_concurrency(
        Router(spill_factor=1e9), random.Random(seed), groups, group_size, replicas, specific
    )
    assert all(len(r) == 1 for r in where.values())
    assert all(k == [COLD] + [AFFINITY] * (group_size - 1) for k in kinds.values())


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), groups=st.integers(1, 24), group_size=st.integers(2, 9), replicas=st.integers(2, 4)
)
def test_with_default_spills_a_group_splits_at_most_once_per_spill(seed, groups, group_size, replicas):
    where, kinds = _random_concurrency(Router(), random.Random(seed), groups, group_size, replicas, 5)
    for g, replicas_used in where.items():
        assert kinds[g][0] == COLD and COLD not in kinds[g][1:]
        assert len(replicas_used) <= 1 + kinds[g].count(SPILL)
