"""The rollout guard (agrpo/trainer/rollout/guard.py) on agrpo's real AgrpoRolloutWorker (TRL's public rollout-worker
protocol, agrpo/trainer/rollout/worker.py) and real spawned processes,
without vLLM: the root cause of the hang (a child that dies while asleep on the stop event makes `set()` wait
forever), that the guard's stop returns anyway, and how failures, deaths and stale heartbeats are reported.
The end-to-end runs with real rewards are in tests/e2e/test_failing_reward.py."""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest
from rollout_children import asleep_on_event_then_exit, exit_with, wait_for_stop

from agrpo.trainer.rollout.guard import (
    RolloutFailed,
    RolloutGuard,
    RolloutWatchdog,
    died_message,
    hang_message,
    reported_message,
    with_progress,
)

BOUNDED_S = 60  # a bound on waits that must end, never a timing assertion


@pytest.fixture()
def worker():
    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker

    return AgrpoRolloutWorker({}, queue_maxsize=4)  # settings: used when it starts


def guard_for(worker, step: int = 3, max_steps: int = 10) -> RolloutGuard:
    """The worker's guard (`worker.guard`: its `stop` and `check_health` go through it), with the trainer at `step`;
    the child is started by the tests themselves (`start_child`), not through the guard's entry."""
    guard = RolloutGuard(worker, lambda: (step, max_steps), run_dir="unused", level="INFO", log_file="/run/logs/t.log")
    worker.guard = guard
    return guard


def start_child(worker, target, *args):
    process = worker.child.context.Process(target=target, args=args, daemon=True)
    process.start()
    worker.child.process = process
    return process


def ends(function) -> bool:
    """Whether `function()` returns within the bound (run in a daemon thread, so a hang does not hang the test)."""
    thread = threading.Thread(target=function, daemon=True)
    thread.start()
    thread.join(BOUNDED_S)
    return not thread.is_alive()


def test_event_set_hangs_once_a_sleeper_died_cpython_75158(worker):
    """The root cause: multiprocessing's Event.set() waits for every registered sleeper to acknowledge."""
    event, ready = worker.child.context.Event(), worker.child.context.Event()
    child = worker.child.context.Process(target=asleep_on_event_then_exit, args=(event, ready), daemon=True)
    child.start()
    assert ready.wait(BOUNDED_S)
    child.join(BOUNDED_S)
    assert child.exitcode == 0
    setter = threading.Thread(target=event.set, daemon=True)  # stays blocked forever: a daemon, left behind
    setter.start()
    setter.join(3.0)
    assert setter.is_alive(), "Event.set() returned: CPython fixed #75158, the guard's bounded set can go"


def test_guarded_stop_returns_when_the_child_died_asleep_on_the_stop_event(worker):
    ready = worker.child.context.Event()
    child = start_child(worker, asleep_on_event_then_exit, worker.channels.stop, ready)
    assert ready.wait(BOUNDED_S)
    child.join(BOUNDED_S)
    guard_for(worker)
    assert ends(worker.stop)
    assert worker.child.process is None


def test_guarded_stop_signals_a_living_child_which_then_exits_by_itself(worker):
    ready = worker.child.context.Event()
    child = start_child(worker, wait_for_stop, worker.channels.stop, ready)
    assert ready.wait(BOUNDED_S)
    guard_for(worker)
    assert ends(worker.stop)
    assert child.exitcode == 0  # it saw the event; the stop did not have to terminate it


def test_a_reported_failure_is_the_childs_paragraph_with_the_step(worker):
    paragraph = "reward term 'politeness' raised ValueError: boom (my_rewards.py, line 3) while scoring the row [x]."
    worker.channels.failure.put(("RewardError", paragraph, "traceback"))
    worker.channels.failed.set()
    guard = guard_for(worker, step=4, max_steps=30)
    with pytest.raises(RolloutFailed) as raised:
        guard.check()
    assert str(raised.value) == paragraph + " Training stopped at step 4 of 30."
    with pytest.raises(RolloutFailed):  # asked again (the next wait, through TRL's check_health): the same paragraph
        worker.check_health(stale_after_s=300)
    assert guard.failure == str(raised.value)


def test_a_child_that_died_without_a_word_is_reported_at_once(worker):
    child = start_child(worker, exit_with, 3)
    child.join(BOUNDED_S)
    with pytest.raises(RolloutFailed, match=r"exited \(3\) without reporting an error"):
        guard_for(worker).check()


def test_a_stale_heartbeat_is_a_hang_only_where_the_trainer_waits(worker):
    worker.channels.heartbeat.value = time.time() - 100
    guard = guard_for(worker)
    guard.check()  # after a step: a back-pressured child does not beat, that is no hang
    with pytest.raises(RolloutFailed, match=r"no heartbeat for 10\d s \(limit 60 s\)"):
        guard.check(stale_after_s=60)


def test_the_watchdog_lets_the_step_finish_then_raises_at_train_end(worker):
    child = start_child(worker, exit_with, 0)
    child.join(BOUNDED_S)
    watchdog = RolloutWatchdog(guard_for(worker))
    control = SimpleNamespace(should_training_stop=False, should_save=True)
    watchdog.on_step_end(None, None, control)
    assert control.should_training_stop and control.should_save  # this step's due checkpoint is still written
    with pytest.raises(RolloutFailed, match="exited"):
        watchdog.on_train_end(None, None, control)


def test_messages():
    assert reported_message("RowError", "generating ... failed.", None) == "generating ... failed."
    other = reported_message("KeyError", "'prompt'", "/r/logs/trainer.log")
    assert other.endswith("failed: KeyError: 'prompt'; the traceback is in /r/logs/trainer.log")
    assert "killed by signal 9 (SIGKILL: often the machine ran out of memory)" in died_message(-signal.SIGKILL, None)
    hang = hang_message(312.4, 300, "/r/logs/trainer.log")
    assert "no heartbeat for 312 s (limit 300 s)" in hang and "trainer.extra.heartbeat_stale_after_s" in hang
    assert with_progress("it broke.", 0, 6) == "it broke. Training stopped at step 0 of 6."


def test_row_failures_name_the_row_and_the_key_for_a_refused_prompt():
    from agrpo.trainer.rollout.child import row_failure

    class Refused(Exception):
        status = 400

    prompt = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 3 + 4?"}]
    text = row_failure(prompt, Refused("400, message='Bad Request'"))
    assert "the row [prompt 'What is 3 + 4?']" in text and "inference.max_model_len" in text


def test_the_heartbeat_stops_at_the_start_of_a_scoring_that_has_not_returned():
    """The generation loop beats too; paced, it keeps turning while a reward hangs, so the beat is held at the start of the unfinished scoring and the trainer's staleness check sees the hang."""
    from agrpo.trainer.rollout.child import ProgressHeartbeat

    raw = SimpleNamespace(value=0.0)
    beat = ProgressHeartbeat(raw)
    beat.value = 100.0
    assert raw.value == 100.0
    beat.scoring_since = 105.0
    beat.value = 110.0  # generation goes on while the reward runs
    beat.value = 400.0
    assert raw.value == 105.0 and beat.value == 105.0  # age, for the trainer: since the scoring began
    beat.scoring_since = None
    beat.value = 401.0
    assert raw.value == 401.0
