"""Background sync: the ordering rules (pure) and the thread around them, with a recording loader (no server)."""

import threading
import time

import pytest

from agrpo.trainer.rollout.admission import worth_starting
from agrpo.trainer.rollout.control import ControlBlock, CountingQueue, samples_ahead
from agrpo.trainer.sync.background import BackgroundSync, Pending, newest, version_needed, versions_to_unload


@pytest.mark.parametrize(
    "published, served, staleness, needed",
    [
        (1, None, 1, 1),  # the first version: the rollout worker needs one to start
        (8, None, 1, 8),  # resumed at v7: the first version published must be served
        (5, 4, 1, 4),  # max_staleness 1: the previous version is enough, the trainer goes on at once
        (5, 3, 1, 4),  # ... but not the one before it (its samples would all be stale)
        (5, 4, 0, 5),  # lock-step: only the new version's samples are usable
        (5, 2, 3, 2),
    ],
)
def test_version_the_trainer_needs_served(published, served, staleness, needed):
    assert version_needed(published, served, staleness) == needed


def test_versions_to_unload_and_the_newest_pending():
    assert versions_to_unload(None, served=1, max_staleness=1) == []  # a fresh run
    assert versions_to_unload(None, served=62, max_staleness=1) == [60]  # resumed: what TRL would unload now
    assert versions_to_unload(60, served=63, max_staleness=1) == [61]
    assert versions_to_unload(61, served=66, max_staleness=1) == [62, 63, 64]  # 63 and 64 were skipped
    assert versions_to_unload(64, served=65, max_staleness=1) == []
    assert versions_to_unload(None, served=6, max_staleness=0) == [5]
    assert newest([Pending(4, "a", 1.0), Pending(6, "c", 3.0), Pending(5, "b", 2.0)]).path == "c"
    assert newest([]) is None


@pytest.mark.parametrize(
    "served, published, staleness, start",
    [
        (4, 0, 1, True),  # blocking sync: nothing is published ahead of what is served
        (4, 4, 1, True),
        (4, 5, 1, False),  # v5 loads: a v4 sample started now would be trained at v6 at best (2 behind)
        (4, 5, 2, True),  # ... which max_staleness 2 allows
        (4, 6, 2, False),
        (5, 5, 0, True),
        (4, 5, 0, False),  # lock-step: only the version being trained on is any use
    ],
)
def test_a_rollout_starts_only_if_it_can_still_be_trained(served, published, staleness, start):
    assert worth_starting(served, published, staleness) is start


class Recorder:
    """A loader whose loads finish when the test says so."""

    def __init__(self):
        self.events = []
        self.release = {}

    def load(self, name, path):
        gate = self.release.setdefault(name, threading.Event())
        self.events.append(("load", name))
        assert gate.wait(10), f"{name} never released"

    def unload(self, name):
        self.events.append(("unload", name))

    def delete(self, path):
        self.events.append(("delete", path.rsplit("/", 1)[-1]))

    def served(self, version):
        self.events.append(("served", version))

    def let(self, name):
        self.release.setdefault(name, threading.Event()).set()


def started(recorder, staleness=1):
    return BackgroundSync(
        lora_name="trl-policy",
        lora_dir="/run/.vllm_lora",
        max_staleness=staleness,
        load=recorder.load,
        unload=recorder.unload,
        delete=recorder.delete,
        on_served=recorder.served,
    )


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_publishing_returns_at_once_and_the_rollouts_move_only_once_served():
    recorder = Recorder()
    sync = started(recorder)
    sync.publish(1, sync.path(1))
    recorder.let("trl-policy-v1")
    assert sync.wait_until_served(1, 10) >= 0 and sync.state.served == 1
    sync.publish(2, sync.path(2))  # the load of v2 is held: the trainer is not
    wait_for(lambda: ("load", "trl-policy-v2") in recorder.events)
    assert sync.state.served == 1 and ("served", 2) not in recorder.events
    with pytest.raises(TimeoutError):
        sync.wait_until_served(2, 0.2)
    recorder.let("trl-policy-v2")
    sync.wait_until_served(2, 10)
    for v in (3, 4):
        recorder.let(f"trl-policy-v{v}")
        sync.publish(v, sync.path(v))
        sync.wait_until_served(v, 10)
    sync.close(drain=True, timeout_s=10)
    # v(N) is served before anything older is unloaded; with max_staleness 1, v(N-2) goes when v(N) is served
    assert recorder.events == [
        ("load", "trl-policy-v1"),
        ("served", 1),
        ("load", "trl-policy-v2"),
        ("served", 2),
        ("load", "trl-policy-v3"),
        ("served", 3),
        ("unload", "trl-policy-v1"),
        ("delete", "trl-policy-v1"),
        ("load", "trl-policy-v4"),
        ("served", 4),
        ("unload", "trl-policy-v2"),
        ("delete", "trl-policy-v2"),
    ]
    metrics = []
    while not sync.metrics.empty():
        metrics.append(sync.metrics.get_nowait()[0])
    assert metrics.count("sync/publish_to_loaded_s") == 4 and metrics.count("sync/versions_behind") == 4


def test_versions_published_while_a_load_is_slow_are_skipped_but_the_newest():
    recorder = Recorder()
    sync = started(recorder, staleness=3)
    sync.publish(1, sync.path(1))
    wait_for(lambda: ("load", "trl-policy-v1") in recorder.events)
    for v in (2, 3, 4):  # a slow bucket: three versions published during v1's load
        sync.publish(v, sync.path(v))
    recorder.let("trl-policy-v1")
    recorder.let("trl-policy-v4")
    sync.wait_until_served(4, 10)
    assert [e for e in recorder.events if e[0] == "load"] == [("load", "trl-policy-v1"), ("load", "trl-policy-v4")]
    assert sync.state.skipped == [2, 3] and not [e for e in recorder.events if e[0] == "unload"]  # all still usable
    recorder.let("trl-policy-v7")
    sync.publish(7, sync.path(7))
    sync.wait_until_served(7, 10)
    sync.close(drain=True, timeout_s=10)
    # v7 served with max_staleness 3: v1-v3 can no longer be asked for; v2 and v3 were never loaded, so only v1 is
    # unloaded (the proxy answers 404 and logs a warning for a version no replica holds)
    assert [e[1] for e in recorder.events if e[0] == "unload"] == ["trl-policy-v1"]
    assert [e[1] for e in recorder.events if e[0] == "delete"] == ["trl-policy-v1", "trl-policy-v2", "trl-policy-v3"]
    assert sync.state.summary() == {"published": 7, "served": 7, "skipped": [2, 3]}


def test_a_failed_load_reaches_the_trainer():
    def broken(name, path):
        raise RuntimeError("HTTP 500 from the proxy")

    sync = BackgroundSync(
        lora_name="trl-policy",
        lora_dir="/x",
        max_staleness=1,
        load=broken,
        unload=lambda n: None,
        delete=lambda p: None,
        on_served=lambda v: None,
    )
    sync.publish(1, "/x/trl-policy-v1")
    with pytest.raises(RuntimeError, match="HTTP 500 from the proxy"):
        sync.wait_until_served(1, 10)
    sync.close(drain=True, timeout_s=5)  # no hang, no second error


def test_the_control_block_is_shared_through_its_path():
    block = ControlBlock.create()
    try:
        child = ControlBlock.attach(block.path)
        block.set("budget", 24)
        child.set("admitted", 30)
        child.set("scored", 16)
        child.set("produced", 16)
        queue = CountingQueue(FakeQueue(5), block)
        for _ in range(3):
            queue.get(timeout=1)
        assert child.get("budget") == 24 and child.get("consumed") == 3 and queue.qsize() == 2
        # 14 rollouts started and not scored + 13 samples on the queue or in the trainer's hands
        assert samples_ahead(child.snapshot()) == 14 + 13
        child.close()
    finally:
        block.close()
    assert not __import__("os").path.exists(block.path)


class FakeQueue:
    def __init__(self, n):
        self.items = list(range(n))

    def get(self, timeout=None):
        return self.items.pop(0)

    def qsize(self):
        return len(self.items)
