"""The tenancy rules as pure code (agrpo/proxy/tenants.py, fair_share.py): registration and its capacity checks,
tokens, leases, namespaces, replica-second attribution and the fair share. No sockets, no clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agrpo.proxy.fair_share import FairShare
from agrpo.proxy.tenant_gate import StreamCount, authorization_of, completion_tokens
from agrpo.proxy.tenants import NoRoom, TenantRegistry, adapter_refusal, attribute, fair_cap, model_refusal


def registry(**kw) -> TenantRegistry:
    return TenantRegistry(**{"max_tenants": 2, "lora_slots": 8, "max_lora_rank": 16, **kw})


def test_register_gives_an_id_a_token_and_keeps_only_its_digest():
    reg = registry()
    a, token_a = reg.register("GSM8K r=8", 20.0, 4, 8, now=100.0, wall=1.0)
    b, token_b = reg.register("gsm8k r=8", 20.0, 4, 8, now=100.0, wall=1.0)
    assert (a.id, b.id) == ("t1-gsm8k-r-8", "t2-gsm8k-r-8")
    assert len(token_a) >= 43 and token_a != token_b
    assert token_a not in repr(a) and token_a.encode() not in a.digest
    assert reg.who(f"Bearer {token_a}") is a
    assert reg.who(f"bearer  {token_b} ") is b
    assert reg.who(f"Bearer {token_a}x") is None
    assert reg.who(token_a) is None  # no scheme
    assert reg.who(None) is None and reg.who("Bearer ") is None


def test_no_room_names_the_knob():
    reg = registry()
    reg.register("a", 20, 4, 8, now=0, wall=0)
    with pytest.raises(NoRoom, match=r"LoRA slots \(--max-loras\).*hold up to 4.*5 more.*max_tenants=N"):
        reg.register("b", 20, 5, 8, now=0, wall=0)
    with pytest.raises(NoRoom, match="rank 32 exceeds the fleet's max_lora_rank 16"):
        reg.register("b", 20, 4, 32, now=0, wall=0)
    reg.register("b", 20, 4, 8, now=0, wall=0)
    with pytest.raises(NoRoom, match=r"already serves 2 run\(s\).*inference.shared.max_tenants=N"):
        reg.register("c", 20, 1, 8, now=0, wall=0)
    assert len(reg.tenants) == 2


def test_unchecked_slots_and_rank():
    reg = registry(lora_slots=0, max_lora_rank=0, max_tenants=3)
    for run in "abc":
        reg.register(run, 20, 1000, 512, now=0, wall=0)
    assert len(reg.tenants) == 3


def test_leases_lapse_renew_and_removal_forgets_the_token():
    reg = registry()
    a, token = reg.register("a", 10.0, 1, 1, now=0.0, wall=0.0)
    b, _ = reg.register("b", 30.0, 1, 1, now=0.0, wall=0.0)
    assert reg.expired(9.9) == []
    assert reg.expired(10.0) == [a]
    reg.renew(a, now=9.0)
    assert reg.expired(18.9) == [] and reg.expired(19.0) == [a]
    assert reg.remove(a.id) is a and reg.remove(a.id) is None
    assert reg.who(f"Bearer {token}") is None
    assert reg.expired(100.0) == [b]


def test_namespaces():
    reg = registry()
    a, _ = reg.register("a", 10.0, 1, 1, now=0.0, wall=0.0)
    b, _ = reg.register("b", 10.0, 1, 1, now=0.0, wall=0.0)
    assert adapter_refusal(a, f"{a.id}/trl-policy-v1", "load") is None
    refusal = adapter_refusal(b, f"{a.id}/trl-policy-v1", "unload")
    assert refusal and f"tenant {b.id} may unload only adapters named '{b.id}/...'" in refusal
    assert adapter_refusal(a, "trl-policy-v1", "load") and adapter_refusal(a, None, "load")
    loaded = {f"{a.id}/trl-policy-v1": b"", "trl-policy-v3": b""}
    assert model_refusal(a, f"{a.id}/trl-policy-v1", loaded) is None
    assert model_refusal(a, f"{a.id}/trl-policy-v9", loaded) is None  # its own, even if not loaded (vLLM's 404)
    assert model_refusal(a, "HuggingFaceTB/SmolLM2-135M-Instruct", loaded) is None  # the base model
    assert model_refusal(a, "", loaded) is None
    assert "not 't1-a/trl-policy-v1'" in model_refusal(b, f"{a.id}/trl-policy-v1", loaded)
    assert model_refusal(b, "trl-policy-v3", loaded)  # the admin's adapter outside every namespace
    assert model_refusal(b, "t7-gone/trl-policy-v1", loaded)


def test_attribution_by_tokens_and_idle_seconds():
    assert attribute({"a": 30, "b": 10, "c": 0}, 4.0) == ({"a": 3.0, "b": 1.0}, 0.0)
    assert attribute({"a": 0}, 2.0) == ({}, 2.0)
    reg = registry()
    a, _ = reg.register("a", 10.0, 1, 1, now=0.0, wall=0.0)
    b, _ = reg.register("b", 10.0, 1, 1, now=0.0, wall=0.0)
    a.tick_tokens, b.tick_tokens = 300, 100
    reg.tick(replicas=2, dt=1.0)
    reg.tick(replicas=2, dt=1.0)  # nobody got a token: idle
    b.tick_tokens = 5
    reg.tick(replicas=1, dt=0.5)
    assert (a.replica_seconds, b.replica_seconds) == (1.5, 1.0)
    assert reg.totals() == {"replica_seconds": 4.5, "replicas": 1, "idle_replica_seconds": 2.0}
    assert a.tick_tokens == b.tick_tokens == 0


@given(st.dictionaries(st.text(max_size=3), st.integers(0, 10**6), max_size=6), st.floats(0, 1e6))
def test_attribution_conserves_replica_seconds(tokens, seconds):
    shares, idle = attribute(tokens, seconds)
    assert all(v >= 0 for v in shares.values()) and idle >= 0
    assert math.isclose(sum(shares.values()) + idle, seconds, rel_tol=1e-9, abs_tol=1e-9)


def test_usage_is_read_from_the_end_of_an_answer():
    body = b'{"choices":[{"text":"completion_tokens"}],"usage":{"prompt_tokens":5,"completion_tokens": 17}}'
    assert completion_tokens(body) == 17
    assert completion_tokens(b'{"choices":[]}') == 0
    assert completion_tokens(b'{"usage":{"completion_tokens":null}}') == 0
    assert authorization_of([(b"Host", b"x"), (b"AUTHORIZATION", b"Bearer k"), (b"authorization", b"y")]) == "Bearer k"
    assert authorization_of([(b"Host", b"x")]) is None


def test_stream_count_uses_usage_when_sent_else_events():
    reg = registry()
    a, _ = reg.register("a", 10.0, 1, 1, now=0.0, wall=0.0)
    count = StreamCount(a)
    count.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\n')
    count.feed(b'data: {"choices":[{"text":"c"}]}\n\ndata: [DONE]\n\n')
    count.done()
    assert a.tokens == a.tick_tokens == 3
    count = StreamCount(a)
    count.feed(b'data: {"choices":[{"text":"a"}]}\n\n')
    count.feed(b'data: {"choices":[],"usage":{"completion_tokens":9}}\n\ndata: [DONE]\n\n')
    count.done()
    assert a.tokens == 12


# ---------------------------------------------------------------------------------------------------- fair share
def test_fair_cap():
    assert fair_cap(8, 0) == 8 and fair_cap(8, 1) == 8 and fair_cap(8, 3) == 3 and fair_cap(2, 5) == 1


def test_a_burst_waits_on_itself_and_the_other_tenant_gets_its_half():
    fair = FairShare(slots=4)
    admitted: list[str] = []
    running: list[tuple[str, str]] = []  # (tenant, ticket), in admission order: the replica answers oldest first

    def arrive(tenant: str, ticket: str) -> None:
        if fair.arrive(tenant, 1, ticket):
            admitted.append(ticket)
            running.append((tenant, ticket))

    for i in range(50):
        arrive("a", f"a{i}")
    for i in range(5):
        arrive("b", f"b{i}")
    assert admitted == ["a0", "a1", "a2", "a3", "b0", "b1"]  # b is under its new cap (2 of 4) at once
    while running:
        tenant, _ = running.pop(0)
        for ticket in fair.leave(tenant, 1):
            admitted.append(ticket)
            running.append((ticket[0], ticket))
    assert sorted(admitted) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(5)])
    assert [t for t in admitted if t[0] == "a"] == [f"a{i}" for i in range(50)]  # FIFO per tenant
    # b's last request is admitted before a's 12th: a's 46 waiting requests never delay b beyond its half
    assert admitted.index("b4") < admitted.index("a11")
    assert fair.in_flight == {} and fair.waiting == {}


ops = st.lists(
    st.tuples(st.sampled_from(["arrive", "leave", "withdraw", "resize"]), st.integers(0, 3), st.integers(1, 4)),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), ops)
def test_fair_share_invariants(slots, steps):
    """Whatever arrives, leaves or gives up: caps never exceed slots, an admission keeps its tenant within the cap
    (or alone), each tenant's requests go FIFO, nothing is lost, and no tenant waits while it is under its cap."""
    fair = FairShare(slots)
    running: dict[str, list] = {}
    waiting: dict[str, list] = {}
    order: dict[str, list] = {}
    serial = 0

    def admitted(tickets):
        for ticket in tickets:
            tenant, n, _ = ticket
            waiting[tenant].remove(ticket)
            running.setdefault(tenant, []).append(ticket)
            order.setdefault(tenant, []).append(ticket)
            assert fair.in_flight[tenant] <= max(fair.cap(), n)

    for op, who, n in steps:
        tenant = "abcd"[who]
        if op == "arrive":
            serial += 1
            ticket = (tenant, n, serial)
            waiting.setdefault(tenant, []).append(ticket)
            if fair.arrive(tenant, n, ticket):
                admitted([ticket])
        elif op == "leave" and running.get(tenant):
            _, m, _ = running[tenant].pop(0)
            admitted(fair.leave(tenant, m))
        elif op == "withdraw" and waiting.get(tenant):
            ticket = waiting[tenant].pop()
            admitted(fair.withdraw(tenant, ticket))
        elif op == "resize":
            fair.slots = max(1, n * 2)
            admitted(fair.resize(n * 2))
        assert 1 <= fair.cap() <= max(1, fair.slots)
        for t in "abcd":
            held = sum(m for _, m, _ in running.get(t, []))
            assert fair.in_flight.get(t, 0) == held
            queue = fair.waiting.get(t, ())
            assert [ticket for ticket, _ in queue] == waiting.get(t, [])
            if queue:  # never starved: it waits only while it holds its share already
                assert held > 0 and held + queue[0][1] > fair.cap()
    for t, tickets in order.items():
        assert [s for _, _, s in tickets] == sorted(s for _, _, s in tickets)


def test_forget_returns_the_waiting_and_frees_the_share():
    fair = FairShare(slots=2)
    assert fair.arrive("a", 1, "a0") and fair.arrive("a", 1, "a1") and not fair.arrive("a", 1, "a2")
    assert fair.arrive("b", 1, "b0") and not fair.arrive("b", 1, "b1")
    assert fair.forget("a") == ["a2"]
    assert fair.resize(2) == ["b1"]  # alone now: b's cap is both slots
