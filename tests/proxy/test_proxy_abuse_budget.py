"""Nobody starves the proxy without credentials (issue 30, item 2).

On main 8d01b7e, 4 connections each declaring a 64 MiB body and withholding its last byte filled the in-flight body
budget (4 x --max-body-bytes): every other client, and the trainer's own admin-token adapter loads, got 503 for 59 s,
and reconnecting after each 408 kept 186 of 188 requests out. The policy (agrpo/proxy/trust.py, BodyBudget) is tested
here without sockets; then the attack is played against the real proxy over loopback, at a quarter of the sizes (the
same ratios), in front of fake replicas (tests/proxy/proxy_fakes.py: no vLLM is needed to hold a body). Every loop is
bounded in count and time; the figure "answered within 1 s" is measured by benchmarks/proxy_slow_body.py.
"""

import asyncio
import json

import aiohttp
import pytest
from proxy_fakes import cluster, completion, open_to, post, wait_until

from agrpo.proxy.trust import PROGRESS_BYTES, STALL_S, BodyBudget

ADMIN = "admin-secret-30"
GOOD = {"Authorization": f"Bearer {ADMIN}"}
LOAD = {"lora_name": "trl-policy-v1", "lora_path": "/a/v1", "load_inplace": False}
MIB = 1024 * 1024


# ---- the policy, without sockets ----------------------------------------------------------------------------------


def test_requests_without_the_token_never_hold_the_share_reserved_for_it():
    budget = BodyBudget(100, reserved=50, per_peer=100)
    a, b = budget.hold("10.0.0.1", False), budget.hold("10.0.0.2", False)
    assert budget.take(a, 30, complete=True) and budget.take(b, 20, complete=True)
    late = budget.hold("10.0.0.3", False)
    assert not budget.take(late, 1, complete=True)  # the open share (50) is full; nothing is arriving to cut off
    trainer = budget.hold("10.0.0.3", True)
    assert budget.take(trainer, 50, complete=True)  # the reserved half is all there
    assert (budget.held, budget.open_held, budget.refused) == (100, 50, 1)
    for hold in (a, b, trainer):
        budget.release(hold)
        budget.release(hold)  # a second release gives back nothing
    assert (budget.held, budget.open_held, budget.by_peer) == (0, 0, {})


def test_one_address_holds_at_most_its_share_and_others_still_fit():
    budget = BodyBudget(100, reserved=0, per_peer=40)
    first, second = budget.hold("127.0.0.1", False), budget.hold("127.0.0.1", False)
    assert budget.take(first, 40, complete=False, now=0.0)
    assert not budget.take(second, 1, complete=False, now=0.5)  # its share is full and `first` is not stalled
    other = budget.hold("127.0.0.2", False)
    assert budget.take(other, 40, complete=False, now=0.5)
    assert budget.by_peer == {"127.0.0.1": 40, "127.0.0.2": 40}


def test_a_body_that_arrived_cuts_off_the_oldest_bodies_still_arriving():
    cut = []
    budget = BodyBudget(100, reserved=50, per_peer=50)
    slow = [budget.hold("127.0.0.1", False, evict=lambda i=i: cut.append(i), now=0.1 * i) for i in range(3)]
    for i, hold in enumerate(slow[:2]):
        assert budget.take(hold, 25, complete=False, now=0.1 * i)
    assert not budget.take(slow[2], 25, complete=False, now=0.3)  # still arriving itself, and nobody is stalled
    small = budget.hold("127.0.0.1", False)
    assert budget.take(small, 10, complete=True, now=0.3)  # arrived whole: the oldest arriving one makes room
    assert cut == [0] and slow[0].held == 0 and budget.evicted == 1
    assert budget.open_held == 35 and budget.by_peer == {"127.0.0.1": 35}
    trainer = budget.hold("127.0.0.1", True)
    assert budget.take(trainer, 50, complete=False, now=0.3)  # the token's share: no eviction needed, never evicted
    assert not budget.take(budget.hold("127.0.0.1", False), 100, complete=True, now=9.0)  # cannot fit: cut nobody
    assert cut == [0] and budget.evicted == 1


def test_a_stalled_body_gives_way_to_another_address_still_arriving_and_trickling_is_not_progress():
    cut = []
    budget = BodyBudget(10 * PROGRESS_BYTES, reserved=0, per_peer=10 * PROGRESS_BYTES)
    trickler = budget.hold("127.0.0.1", False, evict=lambda: cut.append("trickler"), now=0.0)
    assert budget.take(trickler, 10 * PROGRESS_BYTES - 10, complete=False, now=0.0)
    for i in range(10):  # a byte every 0.5 s: arriving, but never PROGRESS_BYTES within STALL_S
        assert budget.take(trickler, 1, complete=False, now=0.5 * (i + 1))
    same = budget.hold("127.0.0.1", False, now=5.0)
    assert not budget.take(same, PROGRESS_BYTES, complete=False, now=5.0)  # its own address's: no turn-taking
    upload = budget.hold("127.0.0.2", False, now=5.0)
    assert budget.take(upload, PROGRESS_BYTES, complete=False, now=5.0)
    assert cut == ["trickler"]
    steady = budget.hold("127.0.0.3", False, now=5.0)
    assert not budget.take(steady, 10 * PROGRESS_BYTES, complete=False, now=5.0 + STALL_S / 2)  # `upload` progresses
    assert budget.held == PROGRESS_BYTES


# ---- the attack, against the real proxy ---------------------------------------------------------------------------


def slow_head(length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (length)
    )


async def withhold_last_byte(proxy, length: int, stop: asyncio.Event, rounds: list) -> None:
    """One attacking connection at a time: declare `length`, send all but the last byte, wait; reconnect whenever
    the proxy closes it (408, 503), a tenth of a second later, at most 60 times."""
    for _ in range(60):
        if stop.is_set():
            return
        reader, writer = await open_to(proxy)
        try:
            writer.write(slow_head(length) + b"{" + b" " * (length - 2))
            await writer.drain()
            done = asyncio.ensure_future(reader.read())
            await asyncio.wait([done, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
            rounds.append(done.result()[:12] if done.done() else b"held")
            done.cancel()
        except (ConnectionError, OSError):
            rounds.append(b"reset")
        finally:
            writer.transport.abort()
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("lean_front", [True, False])
def test_slow_bodies_on_every_connection_leave_others_and_admin_loads_answered(monkeypatch, lean_front):
    monkeypatch.setenv("AGRPO_TEST_ADMIN", ADMIN)
    body = 16 * MIB  # --max-body-bytes; the budget is 4 of them, as the defaults (64 MiB, 256 MiB)
    knobs = dict(
        admin_token_env="AGRPO_TEST_ADMIN",
        lean_front=lean_front,
        max_body_bytes=body,
        max_inflight_body_bytes=4 * body,
        max_body_bytes_per_peer=body,
    )

    async def scenario():
        async with cluster(2, **knobs) as (proxy, fakes, session):
            stop, rounds = asyncio.Event(), []
            attack = [asyncio.ensure_future(withhold_last_byte(proxy, body, stop, rounds)) for _ in range(4)]
            # the attack reached the caps: connections refused (behind aiohttp all four split the address's share, and
            # each was refused; the lean front reads one connection's body faster and lets it hold the share)
            await wait_until(lambda: proxy.budget.refused >= 3, what="the attack refused")
            held = []
            other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
            try:
                for i in range(6):  # bounded: 6 rounds of the run's and others' requests while the attack goes on
                    trainer = await post(session, proxy.url + "/v1/completions", completion([i, 1]), headers=GOOD)
                    load = await post(
                        session, proxy.url + "/v1/load_lora_adapter", {**LOAD, "lora_name": f"v{i}"}, headers=GOOD
                    )
                    local = await post(session, proxy.url + "/v1/completions", completion([i, 2]))  # no token
                    big = json.dumps(completion([7] * 200_000)).encode()  # ~1.2 MB, read in many pieces
                    remote = await post(other, proxy.url + "/v1/completions", data=big)
                    assert [trainer[0], load[0], local[0], remote[0]] == [200] * 4, (i, rounds[-8:])
                    held.append(proxy.budget.by_peer.get("127.0.0.1", 0))
                    await asyncio.sleep(0.3)
            finally:
                await other.close()
                stop.set()
                await asyncio.wait_for(asyncio.gather(*attack), 30)
            assert max(held) <= body  # one address never held more than its share
            if lean_front:  # the body that held the address's share was cut off for the others
                assert proxy.budget.evicted >= 1
            assert sum(len(f.requests("/v1/completions")) for f in fakes) == 6 * 3  # no attacking body was forwarded
            await wait_until(lambda: proxy.budget.held == 0, what="the budget released")

    asyncio.run(scenario())
