"""The rollout child's lifecycle (agrpo/trainer/rollout/process.py) with real processes: a stopped child that queued
samples nobody reads exits by itself (the queues are drained while it is waited for), a child that dies before it is
ready is reported at once, and the child's environment is single-process and GPU-free
(agrpo/trainer/rollout/entry.py)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from agrpo.trainer.rollout.entry import child_environment
from agrpo.trainer.rollout.process import ChildChannels, ChildProcess


def _fill_queue_then_wait(samples, stop_event):
    for _ in range(64):
        samples.put(b"x" * 100_000)  # far more than a pipe holds: the feeder thread blocks until someone reads
    stop_event.wait()


def _exit_at_once(code):
    raise SystemExit(code)


def test_a_stopped_child_with_unread_samples_exits_by_itself():
    """Without the drain the child cannot exit (its queue's feeder waits for a reader) and is terminated after 15 s:
    exit code -15. With it: 0."""
    ctx = mp.get_context("fork")
    channels = ChildChannels.create(ctx, queue_maxsize=0)
    child = ChildProcess(ctx)
    child.process = ctx.Process(target=_fill_queue_then_wait, args=(channels.samples, channels.stop))
    child.process.start()
    process = child.process
    channels.stop.set()
    child.join(channels)
    assert process.exitcode == 0 and child.process is None


def test_a_child_that_exits_before_it_is_ready_is_reported_at_once():
    ctx = mp.get_context("fork")
    channels = ChildChannels.create(ctx, queue_maxsize=2)
    child = ChildProcess(ctx)
    with pytest.raises(RuntimeError, match="exited 3"):
        child.spawn(_exit_at_once, (3,), channels, 300.0, lambda code: RuntimeError(f"exited {code}"))
    assert child.process is None


def test_the_version_and_heartbeat_are_shared_without_their_locks():
    channels = ChildChannels.create(mp.get_context("spawn"), queue_maxsize=1)
    channels.set_version(4)
    assert channels.version() == 4
    channels.heartbeat.get_obj().value = 0.0
    assert channels.beat_age() > 1e9  # never beat: the epoch is long ago


def test_the_child_environment_is_single_process_and_gpu_free():
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/h"}
    child_environment(environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "HOME": "/h"}
