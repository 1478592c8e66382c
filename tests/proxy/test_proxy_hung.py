"""A replica that hangs (SIGSTOP, a stuck host: it accepts connections and answers nothing) is dropped from every
broadcast in progress the moment it is marked unhealthy, instead of holding the others up to --broadcast-timeout-s.

The broadcast rules are tested first without sockets (a `send` that never answers for the hung replica); then with
fake replicas over HTTP, one frozen (`FakeReplica.freeze`, the fakes' SIGSTOP) while the health probe runs."""

import asyncio
import json

import pytest
from proxy_fakes import cluster, completion, post, wait_until

from agrpo.proxy import availability, broadcast
from agrpo.proxy.broadcast import LoadRetry, Reply
from agrpo.proxy.replicas import Replica

RETRY = LoadRetry(deadline_s=5.0, initial_s=0.01, max_s=0.05)
HANG_GUARD_S = 30  # bounds a hang (the hung send never answers); the tests assert what was answered, not when


def load_body(name: str) -> bytes:
    return json.dumps({"lora_name": name, "lora_path": f"/adapters/{name}", "load_inplace": False}).encode()


class Fleet:
    """The replicas' side of an injected `send`: `hung` ones never answer; the others obey (or answer `fail`)."""

    def __init__(self, n: int, hung: int | None = None, fail: dict[int, int] | None = None):
        self.replicas = [Replica(index=i, url=f"http://replica{i}:8000") for i in range(n)]
        self.hung, self.fail = hung, fail or {}
        self.loaded: dict[int, set[str]] = {i: set() for i in range(n)}
        self.paths: dict[int, list[str]] = {i: [] for i in range(n)}
        self.asked = asyncio.Event()  # the hung replica was asked something
        self.abandoned = 0  # sends to the hung replica that were given up on (cancelled)

    async def send(self, replica: Replica, method: str, path_qs: str, body: bytes) -> Reply:
        self.paths[replica.index].append(path_qs)
        if replica.index == self.hung:
            self.asked.set()
            try:
                await asyncio.Event().wait()  # SIGSTOPped: no answer, ever
            except asyncio.CancelledError:
                self.abandoned += 1
                raise
        if replica.index in self.fail:
            return Reply(self.fail[replica.index], b'{"error": "refused"}')
        path = path_qs.split("?")[0]
        name = json.loads(body)["lora_name"] if path.endswith("lora_adapter") else None
        if path == "/v1/load_lora_adapter":
            self.loaded[replica.index].add(name)
        elif path == "/v1/unload_lora_adapter":
            self.loaded[replica.index].discard(name)
        return Reply(200, b"Success")

    async def mark_hung_once_asked(self) -> None:
        """What the health probe does when the hung replica's /health times out."""
        await self.asked.wait()
        self.replicas[self.hung].mark_down("no answer to /health within 5s", hung=True, now=0.0)


async def with_hung_replica(fleet: Fleet, call):
    send = broadcast.abandoned_when_down(fleet.send)
    marker = asyncio.create_task(fleet.mark_hung_once_asked())
    outcome = await asyncio.wait_for(call(send), HANG_GUARD_S)
    await marker
    return outcome


async def served_first(replicas, send):
    return await availability.load_first(
        replicas, "v2", load_body("v2"), send, RETRY, on_served=lambda r: asyncio.sleep(0), on_failed=lambda r, p: None
    )


BROADCASTS = {
    "all-or-nothing load": lambda rs, send: broadcast.load_adapter(rs, load_body("v2"), send, RETRY),
    "serve=first load": served_first,
    "unload": lambda rs, send: broadcast.unload_adapter(rs, json.dumps({"lora_name": "v1"}).encode(), send),
    "pause": lambda rs, send: broadcast.everywhere_or_undo(rs, "/pause?mode=keep", b"", send, "/resume"),
    "resume": lambda rs, send: broadcast.everywhere_or_undo(rs, "/resume", b"", send, "/pause?mode=keep"),
    "reset_prefix_cache": lambda rs, send: broadcast.everywhere(rs, "POST", "/reset_prefix_cache", b"", send),
}


@pytest.mark.parametrize("kind", BROADCASTS)
def test_a_replica_marked_unhealthy_mid_broadcast_neither_blocks_nor_vetoes_it(kind):
    async def scenario():
        fleet = Fleet(3, hung=1)
        outcome = await with_hung_replica(fleet, lambda send: BROADCASTS[kind](fleet.replicas, send))
        await asyncio.sleep(0)  # let the serve=first load tasks finish their bookkeeping
        assert outcome.ok, outcome.body
        assert fleet.abandoned == 1  # its send was given up on, not waited for
        undo = {"pause": "/resume", "resume": "/pause?mode=keep"}.get(kind)
        for index in (0, 2):
            assert undo not in fleet.paths[index]  # all-or-nothing held among the healthy: nothing undone
        if kind.endswith(" load"):
            assert fleet.loaded == {0: {"v2"}, 1: set(), 2: {"v2"}}

    asyncio.run(scenario())


def test_a_failed_load_names_the_dropped_replica_as_silent_so_a_late_landing_is_undone():
    async def scenario():
        fleet = Fleet(3, hung=1, fail={2: 500})
        outcome = await with_hung_replica(
            fleet, lambda send: broadcast.load_adapter(fleet.replicas, load_body("v2"), send, RETRY)
        )
        assert outcome.status == 500 and outcome.silent == (1,)
        assert fleet.loaded[0] == set()  # rolled back where it was accepted
        assert "gave no answer (dropped: marked unhealthy" in json.loads(outcome.body)["error"]["message"]

    asyncio.run(scenario())


def test_a_replica_already_unhealthy_is_waited_for_and_one_that_answers_first_is_not_dropped():
    """The re-admission replays adapters to a replica that is marked unhealthy: those sends are awaited in full. And
    an answer that came before the replica was marked down counts."""

    async def scenario():
        fleet = Fleet(2)
        send = broadcast.abandoned_when_down(fleet.send)
        fleet.replicas[1].mark_down("connection refused", hung=False, now=0.0)
        assert (await send(fleet.replicas[1], "POST", "/v1/load_lora_adapter", load_body("v3"))).ok
        assert fleet.loaded[1] == {"v3"}
        reply = await send(fleet.replicas[0], "POST", "/v1/load_lora_adapter", load_body("v3"))
        fleet.replicas[0].mark_down("no answer to /health within 5s", hung=True, now=0.0)
        assert reply.ok and fleet.loaded[0] == {"v3"}

    asyncio.run(scenario())


def test_marking_up_and_down_keeps_the_replicas_own_record():
    replica = Replica(index=1, url="http://replica1:8000")
    assert replica.mark_down("no answer to /health within 5s", hung=True, now=10.0)
    assert not replica.mark_down("no answer to /health within 5s", hung=True, now=12.0)  # already down
    assert (replica.healthy, replica.hung, replica.down_since, replica.down.is_set()) == (False, True, 10.0, True)
    assert replica.describe()["hung"] is True
    replica.mark_up()
    assert (replica.healthy, replica.hung, replica.down_since, replica.down.is_set()) == (True, False, None, False)
    assert replica.last_error == "" and replica.describe()["hung"] is False


# ---- over HTTP: fake replicas behind a real proxy, one of them frozen


def loaded_on(fake) -> set:
    return set(fake.loaded)


def test_a_frozen_replica_is_dropped_from_the_sync_and_its_requests_and_rejoins_with_the_current_version_only():
    async def scenario():
        async with cluster(2, health_interval_s=0.1, health_timeout_s=1.0) as (proxy, fakes, session):
            url = proxy.url

            async def load(name: str, query: str = ""):
                return (await post(session, url + "/v1/load_lora_adapter" + query, json.loads(load_body(name))))[0]

            assert await load("v1") == 200
            fakes[1].freeze()
            # an all-or-nothing load of v2 and two cold prompts (one goes to each replica: least outstanding work),
            # all sent to the frozen replica too: each goes on without it once the probe marks it unhealthy
            answers = await asyncio.wait_for(
                asyncio.gather(
                    load("v2"),
                    *(post(session, url + "/v1/completions", completion([i], model="v1")) for i in (1, 2)),
                ),
                HANG_GUARD_S,
            )
            assert answers[0] == 200 and loaded_on(fakes[0]) == {"v1", "v2"}
            assert [a[0] for a in answers[1:]] == [200, 200]
            assert {a[1]["X-Agrpo-Replica"] for a in answers[1:]} == {"0"}  # the frozen one's was retried on 0
            assert len(fakes[1].requests("/v1/completions")) == 1
            assert proxy.replicas[1].hung and not proxy.replicas[1].healthy
            # the sync goes on without it
            assert (await post(session, url + "/v1/unload_lora_adapter", {"lora_name": "v1"}))[0] == 200
            assert await load("v3", "?serve=first") == 200
            assert (await post(session, url + "/v1/unload_lora_adapter", {"lora_name": "v2"}))[0] == 200
            assert loaded_on(fakes[0]) == {"v3"} and loaded_on(fakes[1]) == {"v1"}
            fakes[1].load_delay_s = 0.5  # its late load of v2 lands while the proxy replays v3 to it
            fakes[1].thaw()
            await wait_until(lambda: proxy.replicas[1].healthy, what="re-admission after the thaw")
            # re-admitted only once it holds the current version and nothing retired: v1 unloaded, the late v2
            # unloaded, v3 replayed
            assert loaded_on(fakes[1]) == {"v3"}
            assert len(fakes[1].requests("/v1/load_lora_adapter")) == 3  # v1, v2 (landed late), v3 (replayed)
            assert proxy.replicas[1].describe()["adapters"] == ["v3"] and not proxy.replicas[1].hung

    asyncio.run(scenario())
