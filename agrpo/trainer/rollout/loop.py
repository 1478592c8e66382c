"""agrpo's rollout loop: the rollout child's whole job, composed of parts with one concern each.

    dataset rows --(group of num_generations)--> Admission.admit (pacing.py's budget)
        --> Toolbox.draw (an environment, reset) --> Episodes.play (client.py: turns on the proxy; toolbox.py: tools;
            sequences.py: training rows) --> the group, once all its episodes ended
        --> GroupScorer.score (rewards, advantages, RolloutSamples) --> rollout_buffer (TRL's trainer drains it)
    Figures --> metrics_queue (TRL's trainer logs it)        heartbeat, failure, stop: child.py

Two asyncio tasks: generation keeps up to `max_inflight_tasks` episodes running and hands finished groups to a bounded
queue; scoring takes them one at a time and puts the samples on the rollout buffer (waiting while it is full). A
group with a retired adapter version is dropped unscored. A failure anywhere ends both tasks before the HTTP session
closes, is reported to the trainer (child.py) and ends the process; the trainer's stop cancels both (nobody trains
on what is still in flight).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from agrpo.models.chat_template import TurnRenderer, response_ready
from agrpo.trainer.sync.retention import OPEN_VERSION_METRIC
from agrpo.trainer.rollout.admission import Admission
from agrpo.trainer.rollout.child import ProgressHeartbeat, RowError, exit_now, report, row_failure
from agrpo.trainer.rollout.client import ProxyClient, VersionRetired
from agrpo.trainer.rollout.episode import EpisodeRules, Episodes
from agrpo.trainer.rollout.figures import Figures
from agrpo.trainer.rollout.scorer import Group, GroupScorer
from agrpo.trainer.rollout.toolbox import Toolbox, with_observation

log = logging.getLogger(__name__)
DROPPED_COUNTER = "rollout/retired_dropped_total"  # groups dropped because an adapter version was retired
BUFFER_POLL_S = 0.1


@dataclass
class LoopSettings:
    """What the loop is given: TRL's config values under TRL's names (loop_arguments in worker.py), what TRL derives
    while building the trainer (`bind`), and agrpo's pacing (`pace`). Defaults are TRL 1.16's."""

    dataset: Any
    reward_funcs: list[Any]
    model_name: str
    processing_class: Any
    eos_token_ids: list[int]
    vllm_server_url: str
    lora_name: str | None = None
    tools: list[Any] | None = None
    environment_factory: Any = None
    num_generations: int = 8
    max_inflight_tasks: int = 128
    queue_maxsize: int = 0
    score_queue_maxsize: int = 16
    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    request_timeout: float = 120
    chat_template_kwargs: dict[str, Any] | None = None
    max_tool_calling_iterations: int | None = None
    log_completions: bool = False
    num_completions_to_print: int | None = None
    fork_threshold_tokens: int = 1024
    dataset_start_index: int = 0
    agrpo_control: str | None = None  # the pacing's control block (pacing.py); None: not paced
    agrpo_max_staleness: int = 0

    def sampling(self) -> dict[str, Any]:
        values = dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        values["repetition_penalty"] = self.repetition_penalty
        if self.min_p is not None:
            values["min_p"] = self.min_p
        return values


class RolloutLoop:
    """Built in the child on its channels (process.py's ChildChannels); `run` until stopped or failed."""

    def __init__(self, channels: Any, **settings: Any):
        s = self.settings = LoopSettings(**settings)
        self.channels = channels
        self.version_value = channels.model_version.get_obj()  # lockless: process.py says why
        self.heartbeat = ProgressHeartbeat(channels.heartbeat.get_obj())
        self.figures = Figures(channels.metrics)
        self.pool = ThreadPoolExecutor(max_workers=max(1, s.max_inflight_tasks), thread_name_prefix="agrpo-tool")
        self.toolbox = Toolbox(s.tools, s.environment_factory, self.pool, self.figures)
        agent = self.toolbox.any_tools or bool(self.toolbox.factories)
        tokenizer = response_ready(s.processing_class)
        rules = EpisodeRules(
            tokenizer=tokenizer,
            render=TurnRenderer(tokenizer, s.chat_template_kwargs, keep_prefix=self.toolbox.any_tools),
            max_tool_calls=s.max_tool_calling_iterations,
            fork_threshold=s.fork_threshold_tokens,
            eos_ids=(*s.eos_token_ids, tokenizer.pad_token_id),
            agent=agent,
        )
        self.client = ProxyClient(
            s.vllm_server_url, s.sampling(), s.request_timeout, s.max_inflight_tasks, self.figures.count
        )
        self.episodes = Episodes(rules, self.client, self.toolbox, self.figures, self.model_now)
        if not s.reward_funcs and not self.toolbox.reward_classes:
            raise ValueError("No reward source: pass `reward_funcs`, or an environment that defines `get_reward`.")
        self.scorer = GroupScorer(s.reward_funcs, self.toolbox.reward_classes, self.heartbeat, self.figures, agent)
        self.admission = Admission(s.agrpo_control, s.agrpo_max_staleness, self.version, lambda: self.stopping)
        self.open_versions: collections.Counter[int] = collections.Counter()
        self.running: set[asyncio.Task] = set()
        self.to_score: asyncio.Queue | None = None
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.main_tasks: list[asyncio.Task] = []
        self.stopping = False
        self.tokens_made = self.tokens_reported = 0
        self.reported_at = time.monotonic()
        self.groups_scored = 0

    # ---- versions
    def version(self) -> int:
        return int(self.version_value.value)

    def model_now(self) -> tuple[str, int]:
        """(the model a request names now, its adapter version): `<adapter>-vN`, or the base model (full-weight sync)."""
        version = self.version()
        name = self.settings.model_name if self.settings.lora_name is None else f"{self.settings.lora_name}-v{version}"
        return name, version

    def open_version_floor(self) -> int:
        """The oldest version an open rollout started on (the newest version when none is open): no request below it
        can start again, so the trainer may delete those versions' files (adapter_retention.py)."""
        return min((v for v, n in self.open_versions.items() if n > 0), default=self.version())

    # ---- life
    def run(self) -> None:
        """Until the trainer stops it; a failure is reported and ends the process (child.py)."""
        self.event_loop = asyncio.new_event_loop()
        try:
            self.event_loop.run_until_complete(self._main())
        except BaseException as error:
            log.debug("the rollout loop failed", exc_info=True)  # trainer.log; the trainer shows one paragraph
            report(self.channels.failure, self.channels.failed, error)
            exit_now(self.channels.failure, [self.channels.samples, self.channels.metrics])
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.event_loop.close()

    def request_stop(self) -> None:
        """From the stop watcher's thread: stop on the event loop, now if it runs, else as soon as it starts."""
        self.stopping = True
        if self.event_loop is not None:
            try:
                self.event_loop.call_soon_threadsafe(self._cancel_main)
            except RuntimeError:  # the loop already closed: nothing left to stop
                pass

    def _cancel_main(self) -> None:
        for task in self.main_tasks:
            task.cancel()

    async def _main(self) -> None:
        self.to_score = asyncio.Queue(maxsize=self.settings.score_queue_maxsize)
        await self.client.open()
        try:
            self.main_tasks = [asyncio.create_task(self._keep_generating()), asyncio.create_task(self._score())]
            if self.stopping:
                self._cancel_main()
            await asyncio.gather(*self.main_tasks)
        except asyncio.CancelledError:
            if not self.stopping:  # cancelled by anything but the trainer's stop: not ours to swallow
                raise
        finally:  # everything left, cancelled and awaited before the session closes
            current = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.client.close()

    # ---- generation
    def _groups(self):
        """Each dataset row `num_generations` times, from `dataset_start_index` on, round and round."""
        s = self.settings
        group_id = 0
        while True:
            row = s.dataset[(s.dataset_start_index + group_id) % len(s.dataset)]
            group = Group(group_id, row, s.num_generations)
            for _ in range(s.num_generations):
                yield group
            group_id += 1

    async def _keep_generating(self) -> None:
        work = self._groups()
        while True:
            self.heartbeat.beat()
            while len(self.running) < self.settings.max_inflight_tasks:
                self.running.add(asyncio.create_task(self._rollout(next(work))))
            done, _ = await asyncio.wait(self.running, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self.running.discard(task)
                task.result()  # a failed episode ends the run

    async def _rollout(self, group: Group) -> None:
        """One episode of the group's row: admitted, played, its environment's reward taken; the group handed on
        when it is the last."""
        row, environment, result, reward = group.row, None, None, None
        name = self.toolbox.environment_name(row)
        await self.admission.admit()
        version = self.version()  # its requests ask this version or a newer one
        self.open_versions[version] += 1
        try:
            environment, observation = await self.toolbox.draw(name, row)
            base = row["prompt"] if "prompt" in row or not self.toolbox.factories else [{"role": "user", "content": ""}]
            prompt = with_observation(base, observation)
            try:
                result = await self.episodes.play(
                    prompt, self.toolbox.schema_tools(name), self.toolbox.callable_tools(environment)
                )
            except VersionRetired as retired:
                group.retired = True
                self.figures.count(DROPPED_COUNTER)
                log.debug("dropping group %s: adapter version retired (%s)", group.group_id, retired)
            except Exception as error:  # CancelledError is no Exception: cancellation passes through
                raise RowError(row_failure(prompt, error)) from error
            if result is not None:
                reward = await self.toolbox.reward(environment)
        finally:
            self.open_versions[version] -= 1
            self.admission.finished()
            self.toolbox.give_back(name, environment)
        if result is not None:
            group.prompts.append(prompt)
            group.results.append(result)
            group.env_rewards.append(reward)
            self.tokens_made += len(result.completion_ids)
        group.finished += 1
        if group.complete:
            await self._hand_on(group)

    async def _hand_on(self, group: Group) -> None:
        if group.retired:  # the trainer would drop it as stale: never scored
            self.figures.push(
                {**self.admission.scored(group.size, 0), OPEN_VERSION_METRIC: float(self.open_version_floor())}
            )
            return
        group.queued_at = time.monotonic()
        if self.to_score.full():
            await self.to_score.put(group)
            self.figures.push({"rollout/score_block_s": time.monotonic() - group.queued_at})  # generation held back
        else:
            self.to_score.put_nowait(group)

    # ---- scoring
    async def _score(self) -> None:
        while True:
            self.heartbeat.beat()
            try:
                group = await asyncio.wait_for(self.to_score.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            waited = time.monotonic() - group.queued_at
            started = time.monotonic()
            samples = await self.scorer.score(group)
            now = time.monotonic()
            figures = {
                "rollout/score_s": now - started,
                "rollout/score_wait_s": waited,
                "rollout/score_queue_size": float(self.to_score.qsize()),
                "rollout/inflight": float(len(self.running)),
                "rollout/generated_tok_s": (float(self.tokens_made - self.tokens_reported), now - self.reported_at),
                OPEN_VERSION_METRIC: float(self.open_version_floor()),
                **self.admission.scored(group.size, len(samples)),
            }
            self.tokens_reported, self.reported_at = self.tokens_made, now
            self.figures.push(figures)
            self._print(samples)
            await self._deliver(samples)

    def _print(self, samples: list[Any]) -> None:
        """TRL's sample table on the console, with `trainer.log_completions`."""
        self.groups_scored += 1
        if not (self.settings.log_completions and samples):
            return
        from trl.trainer.utils import print_prompt_completions_sample

        print_prompt_completions_sample(
            prompts=[s.prompt for s in samples],
            completions=[s.completion for s in samples],
            rewards={"reward": [s.metrics["reward"] for s in samples]},
            advantages=[s.advantage for s in samples],
            step=self.groups_scored - 1,
            num_samples=self.settings.num_completions_to_print,
        )

    async def _deliver(self, samples: list[Any]) -> None:
        """Onto the rollout buffer, waiting while the trainer has not made room."""
        for sample in samples:
            blocked = None
            while True:
                try:  # stamped as it goes on the queue: TRL's trainer measures `sample/time_in_queue_s` from it
                    self.channels.samples.put_nowait(replace(sample, enqueued_at=time.time()))
                    break
                except queue.Full:
                    blocked = blocked or time.monotonic()
                    await asyncio.sleep(BUFFER_POLL_S)
            if blocked is not None:
                self.figures.push({"rollout/backpressure_s": time.monotonic() - blocked})
