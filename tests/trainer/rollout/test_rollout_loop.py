"""agrpo's rollout loop (agrpo/trainer/rollout/loop.py) whole, in this process, against a stand-in for vLLM on
loopback (no model: the stand-in answers fixed token ids) and the real tiny tokenizer, dataset, rewards and the
channels the trainer shares with the child: groups of num_generations samples, each labelled with the version its
requests asked for; a retired version's group dropped unscored without stalling the loop; the figures under TRL's
names; the trainer's stop ends the loop at once even with requests hanging. A failing reward, through the real
spawned child (the failure path ends the process), reaches the trainer's guard as one paragraph. The whole loop
against real vLLM runs in the e2e runs (tests/e2e/test_pipeline.py and the others)."""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import time

import pytest
from datasets import Dataset

from agrpo.trainer.sync.retention import OPEN_VERSION_METRIC
from agrpo.trainer.rollout.loop import DROPPED_COUNTER, RolloutLoop
from agrpo.trainer.rollout.process import ChildChannels
from tests.trainer.rollout.stand_in_vllm import completion, stand_in_vllm

BOUNDED_S = 60  # a bound on waits that must end, never a timing assertion
EOS = 0


def length_reward(completions, **columns):
    return [float(len(c[0]["content"])) for c in completions]


def failing_reward(completions, **columns):
    raise ValueError("the judge is down")


def settings(url: str, **changes) -> dict:
    from agrpo.models.tiny import build_tokenizer

    rows = {"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(3)], "answer": ["a", "b", "c"]}
    values = dict(
        dataset=Dataset.from_dict(rows),
        reward_funcs=[length_reward],
        model_name="base",
        lora_name="trl-policy",
        processing_class=build_tokenizer(),
        eos_token_ids=[EOS],
        vllm_server_url=url,
        num_generations=4,
        max_inflight_tasks=8,
        queue_maxsize=64,
        max_tokens=8,
    )
    return {**values, **changes}


def replies(request) -> tuple:
    """A reply of 1 to 4 tokens (its length by the prompt's length), ending on EOS."""
    return completion([65 + len(request["prompt"]) % 4] * (1 + len(request["prompt"]) % 4) + [EOS])


class Running:
    """The loop on its own thread, as the child's main thread runs it."""

    def __init__(self, url: str, version: int = 1, **changes):
        self.channels = ChildChannels.create(mp.get_context("spawn"), 64)
        self.channels.set_version(version)  # the trainer's first sync happens before the worker starts
        self.loop = RolloutLoop(self.channels, **settings(url, **changes))
        self.thread = threading.Thread(target=self.loop.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def samples(self, n: int) -> list:
        return [self.channels.samples.get(timeout=BOUNDED_S) for _ in range(n)]

    def figures(self) -> dict[str, list]:
        found: dict[str, list] = {}
        while True:
            try:
                for key, value in self.channels.metrics.get(timeout=0.2).items():
                    found.setdefault(key, []).append(value)
            except queue.Empty:
                return found

    def __exit__(self, *exc):
        self.loop.request_stop()
        self.thread.join(BOUNDED_S)
        # samples nobody will read stay in the queues' pipes: without this, their feeder threads would hold this
        # process at exit, writing into a full pipe (the child's exit_now does the same; process.py drains instead)
        for channel in (self.channels.samples, self.channels.metrics):
            channel.cancel_join_thread()
        assert not self.thread.is_alive(), "the loop did not end after the stop"


def by_version(request) -> tuple:
    """A reply whose tokens say which adapter version was asked for (65 + N for `trl-policy-vN`), ending on EOS."""
    version = int(request["model"].rpartition("-v")[2])
    return completion([65 + version] * (1 + len(request["prompt"]) % 4) + [EOS])


def test_groups_of_samples_labelled_with_the_version_their_requests_asked_for():
    with stand_in_vllm(by_version) as (url, server), Running(url) as running:
        first = running.samples(8)
        running.channels.set_version(2)
        later = []  # until 8 samples of v2 came (what is queued of v1 comes first)
        while sum(s.model_version == 2 for s in later) < 8 and len(later) < 400:
            later += running.samples(1)
        while sum(s.group_id == later[-1].group_id for s in later) < 4:  # a group sent across the switch: its rest
            later += running.samples(1)
        figures = running.figures()
    for sample in first + later:  # the version a sample is labelled with is the one its tokens were sampled from
        asked = {int(t) - 65 for t, m in zip(sample.input_ids, sample.completion_mask) if m and t != EOS}
        assert asked == {sample.model_version}
    assert {s.model_version for s in first} == {1} and sum(s.model_version == 2 for s in later) >= 8
    by_group: dict[int, list] = {}
    for sample in first + later:
        by_group.setdefault(sample.group_id, []).append(sample)
    # one scoring task delivers group after group, so what was read is whole groups of num_generations (each sample
    # labelled with its own version: a group whose requests went out across the switch holds both)
    assert [len(group) for group in by_group.values()] == [4] * len(by_group) and len(by_group) >= 4
    for group in by_group.values():
        assert len({s.prompt[0]["content"] for s in group}) == 1  # one dataset row per group
        assert abs(sum(s.advantage for s in group)) < 1e-5  # group-normalised
    models = server.models()
    assert "trl-policy-v1" in models and "trl-policy-v2" in models and set(models) <= {"trl-policy-v1", "trl-policy-v2"}
    assert all(s.enqueued_at is not None and s.input_ids[-1] == EOS for s in first)
    for key in (
        "completions/mean_length",
        "rollout/turns_mean",
        "rollout/score_s",
        "rollout/generated_tok_s",
        "rollout/samples_generated_total",
        OPEN_VERSION_METRIC,
        "completions/clipped_ratio",
    ):
        assert key in figures, key
    assert all(isinstance(v, tuple) for v in figures["completions/mean_length"])  # rates: (num, den)
    assert figures["completions/clipped_ratio"][0][0] == 0.0  # every reply ended on EOS


def test_a_retired_versions_groups_are_dropped_unscored_and_the_loop_goes_on(caplog):
    """Each dropped group is a DEBUG line (trainer.log only: the console says it once, console/events.py)."""

    def answer(request):
        if request["model"] == "trl-policy-v1":
            return 410, {"error": {"message": "retired"}}, {}
        return replies(request)

    caplog.set_level(logging.DEBUG, logger="agrpo.trainer.rollout.loop")
    with stand_in_vllm(answer) as (url, server), Running(url, agrpo_max_staleness=1) as running:
        deadline = time.monotonic() + BOUNDED_S
        while "trl-policy-v1" not in server.models() and time.monotonic() < deadline:
            time.sleep(0.01)
        running.channels.set_version(2)
        samples = running.samples(16)
        figures = running.figures()
    assert {s.model_version for s in samples} == {2}  # nothing of a dropped group reached the trainer
    assert sum(figures[DROPPED_COUNTER]) >= 1
    lines = [r for r in caplog.records if r.getMessage().startswith("dropping group")]
    assert len(lines) >= sum(figures[DROPPED_COUNTER]) and {r.levelno for r in lines} == {logging.DEBUG}
    assert running.loop.admission.counts["scored"] >= 4  # dropped groups count as done: the pacing cannot stall


def test_the_trainers_stop_ends_the_loop_at_once_with_requests_hanging():
    """The requests hang three times longer than the loop is given to end: it ends without waiting for them."""
    hang = threading.Event()

    def answer(request):
        hang.wait(3 * BOUNDED_S)
        return replies(request)

    with stand_in_vllm(answer) as (url, server), Running(url) as running:
        deadline = time.monotonic() + BOUNDED_S
        while len(server.seen) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        running.loop.request_stop()
        running.thread.join(BOUNDED_S)
        ended = not running.thread.is_alive()
        hang.set()
    assert ended  # within BOUNDED_S, while every request was still hanging
    assert len(server.seen) == 8  # max_inflight_tasks requests, none after the stop


def test_a_failing_reward_reaches_the_trainer_as_one_paragraph_from_the_spawned_child():
    from agrpo.rewards.base import WeightedReward
    from agrpo.trainer.rollout.guard import RolloutFailed, RolloutGuard
    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker

    with stand_in_vllm(replies) as (url, server):
        rewards = [WeightedReward(failing_reward, 1.0)]  # as build_reward_funcs wraps a user's reward
        worker = AgrpoRolloutWorker(settings(url, reward_funcs=rewards), queue_maxsize=64)
        worker.guard = RolloutGuard(worker, lambda: (2, 10), run_dir=None, level="INFO", log_file="/r/logs/trainer.log")
        worker.update_model_version(1)
        worker.start()
        try:
            deadline = time.monotonic() + BOUNDED_S
            with pytest.raises(RolloutFailed) as failed:
                while time.monotonic() < deadline:
                    worker.check_health(BOUNDED_S)
                    time.sleep(0.1)
        finally:
            worker.stop()
    text = str(failed.value)
    assert "reward term 'failing_reward' raised ValueError: the judge is down" in text and "Traceback" not in text
    assert "step 2 of 10" in text and worker.child.process is None
