"""The adapter retention policy: TRL's deletion of a published version waits until its unload is `retain_s` old."""

import os

import pytest

from agrpo.trainer.seam.module_patches import RetainingShutil

from agrpo.trainer.sync.retention import (
    FINISHED_MARGIN_S,
    OPEN_VERSION_METRIC,
    AdapterRetention,
    OpenVersionsCallback,
    default_retain_s,
)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def policy(tmp_path):
    clock, deleted = Clock(), []
    retention = AdapterRetention(
        str(tmp_path / ".vllm_lora"), "trl-policy", retain_s=60.0, clock=clock, delete=deleted.append
    )
    return retention, clock, deleted


def path(retention, name):
    return os.path.join(retention.lora_dir, name)


def test_versions_are_parsed_only_directly_under_the_adapter_dir(policy, tmp_path):
    retention, _, _ = policy
    assert retention.version_of(path(retention, "trl-policy-v12")) == 12
    assert retention.version_of(path(retention, ".trl-policy-v12.tmp")) is None  # TRL's staging folder
    assert retention.version_of(path(retention, "trl-policy-v12/default")) is None
    assert retention.version_of(str(tmp_path / "trl-policy-v3")) is None  # elsewhere
    assert retention.version_of(path(retention, "other-v3")) is None


def test_an_unloaded_version_is_kept_until_retain_s_after_its_unload(policy):
    retention, clock, deleted = policy
    for version in (1, 2, 3, 4):
        retention.loaded(version)
    retention.unloaded(1)  # the sync that loaded v3 unloaded v1 (max_staleness 1)
    clock.now += 1
    assert retention.request_delete(path(retention, "trl-policy-v1")) is True  # TRL's rmtree, one sync later
    assert deleted == []  # a request for v1 may still be queued inside an engine
    clock.now += 58.9
    assert retention.collect() == [] and deleted == []
    clock.now += 0.2
    assert retention.collect() == [1]
    assert deleted == [path(retention, "trl-policy-v1")]
    assert retention.pending == {}


def test_the_version_being_written_and_foreign_paths_are_deleted_at_once(policy):
    retention, _, _ = policy
    retention.loaded(5)
    # save_lora_adapter clears its destination (the next version) and its staging folder before writing.
    assert retention.request_delete(path(retention, "trl-policy-v6")) is False
    assert retention.request_delete(path(retention, ".trl-policy-v6.tmp")) is False
    assert retention.request_delete("/somewhere/else") is False
    assert retention.pending == {}


def test_a_version_never_unloaded_counts_from_its_delete_request(policy):
    retention, clock, deleted = policy
    retention.loaded(9)
    assert retention.request_delete(path(retention, "trl-policy-v2"))
    clock.now += 59
    assert retention.collect() == []
    clock.now += 1
    assert retention.collect() == [2]


def test_due_folders_are_deleted_oldest_first_on_the_next_request(policy):
    retention, clock, deleted = policy
    retention.loaded(10)
    for version in (3, 4):
        retention.unloaded(version)
        retention.request_delete(path(retention, f"trl-policy-v{version}"))
        clock.now += 40
    # v3 is 80 s old, v4 40 s: the next deferred delete (v5) collects v3 only.
    retention.unloaded(5)
    retention.request_delete(path(retention, "trl-policy-v5"))
    assert deleted == [path(retention, "trl-policy-v3")]
    assert sorted(retention.pending) == [4, 5]


def test_the_shutil_stand_in_defers_only_published_versions(tmp_path):
    lora_dir = tmp_path / ".vllm_lora"
    for name in ("trl-policy-v1", "trl-policy-v2", ".trl-policy-v3.tmp"):
        (lora_dir / name).mkdir(parents=True)
        (lora_dir / name / "adapter_config.json").write_text("{}")
    retention = AdapterRetention(str(lora_dir), "trl-policy", retain_s=3600.0)
    retention.loaded(2)
    stand_in = RetainingShutil(retention)
    stand_in.rmtree(str(lora_dir / "trl-policy-v1"), ignore_errors=True)
    stand_in.rmtree(str(lora_dir / ".trl-policy-v3.tmp"), ignore_errors=True)
    assert (lora_dir / "trl-policy-v1" / "adapter_config.json").is_file()  # kept: still readable by an engine
    assert not (lora_dir / ".trl-policy-v3.tmp").exists()  # staging folders go at once
    assert stand_in.copytree is __import__("shutil").copytree  # everything else is the real module


def test_default_retention_outlives_the_client_request_timeout():
    assert default_retain_s(600) > 600


def test_a_version_below_the_workers_open_floor_goes_a_margin_after_the_floor_was_seen(policy):
    """Direct to one replica: the rollout worker's floor (the oldest version an open rollout started on) bounds what
    is kept by what can still be in flight, not by the 630 s worst case (44 versions by step 55 of the smoke run)."""
    retention, clock, deleted = policy
    for version in range(1, 6):
        retention.loaded(version)
    for version in (1, 2, 3):
        retention.unloaded(version)
        assert retention.request_delete(path(retention, f"trl-policy-v{version}"))
    assert retention.none_open_below(3) == [] and deleted == []  # seen now: the abort margin has not passed
    clock.now += FINISHED_MARGIN_S
    assert retention.collect() == [1, 2]  # v3 still has a rollout open on it
    retention.none_open_below(2)  # a stale (lower) report changes nothing
    clock.now += FINISHED_MARGIN_S
    assert retention.collect() == []
    retention.none_open_below(5)
    clock.now += FINISHED_MARGIN_S
    assert retention.collect() == [3] and deleted == [path(retention, f"trl-policy-v{v}") for v in (1, 2, 3)]


def test_without_a_floor_the_time_bound_stays(policy):
    retention, clock, deleted = policy
    retention.loaded(3)
    retention.unloaded(1)
    retention.request_delete(path(retention, "trl-policy-v1"))
    clock.now += 59.0
    assert retention.collect() == []
    clock.now += 1.0
    assert retention.collect() == [1]


def test_the_callback_hands_the_logged_floor_to_the_policy(policy):
    retention, clock, _ = policy
    callback = OpenVersionsCallback(retention)
    callback.on_log(None, None, None, logs={"loss": 0.1})
    assert retention.floors == []
    callback.on_log(None, None, None, logs={OPEN_VERSION_METRIC: 4.0})
    assert retention.floors == [(clock.now, 4)]


def test_the_worker_reports_the_oldest_version_an_open_rollout_started_on():
    """The loop counts each open rollout under the version it started on (agrpo/trainer/rollout/loop.py `_rollout`;
    tests/trainer/rollout/test_rollout_loop.py runs it); the floor is the oldest open one, else the current one."""
    import collections
    from types import SimpleNamespace

    from agrpo.trainer.rollout.loop import RolloutLoop

    loop = RolloutLoop.__new__(RolloutLoop)
    loop.open_versions, loop.version_value = collections.Counter(), SimpleNamespace(value=3)
    assert loop.open_version_floor() == 3
    loop.open_versions[3] += 1  # a rollout opened on v3
    loop.version_value.value = 5  # v5 loaded while it is open
    loop.open_versions[5] += 1
    assert loop.open_version_floor() == 3
    loop.open_versions[3] -= 1
    assert loop.open_version_floor() == 5
    loop.open_versions[5] -= 1
    loop.version_value.value = 6
    assert loop.open_version_floor() == 6  # none open: every older version is free


def test_the_sync_thread_and_the_log_step_collecting_at_once_take_each_folder_once(tmp_path):
    """The trainer's log step (the worker's floor) and the sync (TRL's delete request, on the sync thread in
    background mode) both collect; once, both took the same due version and the second crashed the run (KeyError)."""
    import threading

    deleted = []
    retention = AdapterRetention(str(tmp_path), "trl-policy", retain_s=0.0, delete=deleted.append)
    retention.loaded(10_000)
    barrier = threading.Barrier(2)

    def ask(versions):
        barrier.wait()
        for version in versions:
            retention.request_delete(path(retention, f"trl-policy-v{version}"))
            retention.none_open_below(version)

    threads = [threading.Thread(target=ask, args=(range(start, 4000, 2),)) for start in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(deleted) == sorted(set(deleted)) and len(deleted) == 4000
