"""The rollout child's loop: agrpo's `AgrpoRolloutLoop` (rollout_loop.py), guarded (why: rollout_guard.py).

It runs in the spawned child only. Compared with TRL's loop it never sleeps on a cross-process Condition (the stop
watcher polls), never takes the shared values' locks, names the row whose prompt could not be rendered or generated,
cancels its pending work before the event loop closes, and, once a failure is reported to the trainer, exits at
once instead of printing three tracebacks and waiting for threads or queues nobody will read.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import sys
import threading
import time
import traceback
from typing import Any


from agrpo.errors import AgrpoError
from agrpo.rewards.contract import describe_row, raised_at
from agrpo.rewards.unscored import UNSCORED_METRIC, UnscoredTally
from agrpo.trainer.sync.retention import OPEN_VERSION_METRIC
from agrpo.trainer.rollout_loop import AgrpoRolloutLoop

log = logging.getLogger(__name__)
STOP_POLL_S = 0.1


class RowError(AgrpoError):
    """A row's prompt could not be rendered through the chat template, or vLLM refused it."""


def row_failure(prompt: Any, error: BaseException) -> str:
    """The paragraph for a row whose completion could not be generated."""
    where = raised_at(error)
    status = getattr(error, "status", None)
    hint = (
        " vLLM refuses a prompt that does not fit: check that prompt tokens (with the tool list, in an agent run) + "
        "trainer.max_completion_length stay within inference.max_model_len"
        if status == 400
        else ""
    )
    return (
        f"generating a completion for the row [{describe_row({'prompts': [prompt]})}] failed: "
        f"{type(error).__name__}: {error}" + (f" ({where})" if where and status is None else "") + f".{hint}"
    )


def poll_stop_event(rollout_loop: GuardedRolloutLoop, stop_event: Any) -> None:
    """TRL's stop watcher, polling the event instead of sleeping in its Condition: a child that exits while
    registered as a sleeper makes the trainer's `set()` wait forever (CPython #75158)."""

    def watch() -> None:
        while not stop_event.is_set():
            time.sleep(STOP_POLL_S)
        rollout_loop.request_stop()

    threading.Thread(target=watch, daemon=True, name="grpo-mp-stop-watcher").start()


def exit_now(info_queue: Any, data_queues: list[Any]) -> None:
    """End the child once its failure is on `info_queue`: the report is flushed into the pipe, scored samples nobody
    will train on are dropped (a full pipe would hold the exit), and no stuck thread can keep the process alive."""
    for data in data_queues:
        data.cancel_join_thread()
    info_queue.close()
    info_queue.join_thread()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def report(info_queue: Any, failed_event: Any, error: BaseException) -> None:
    """TRL's failure protocol: the exception's (type name, message, traceback) on the queue, then the event."""
    try:
        info_queue.put_nowait((type(error).__name__, str(error), traceback.format_exc()))
    except Exception:  # full: an earlier failure is already there
        pass
    failed_event.set()


class ProgressHeartbeat:
    """The heartbeat TRL's loops write (`.value = time.time()`), held back to the start of a reward call that has not
    returned. TRL beats from its generation loop too, which keeps turning while a reward hangs whenever generation is
    paced (rollout_child.py) rather than blocked on a full scoring queue; the trainer then saw a live child forever.
    Now the trainer's staleness check measures how long the oldest unfinished scoring has run."""

    def __init__(self, raw: Any):
        self.raw = raw  # the shared memory, without the value's lock (read and written whole: no lock needed)
        self.scoring_since: float | None = None

    @property
    def value(self) -> float:
        return self.raw.value

    @value.setter
    def value(self, now: float) -> None:
        self.raw.value = now if self.scoring_since is None else min(now, self.scoring_since)


class GuardedRolloutLoop(AgrpoRolloutLoop):
    """agrpo's loop (token, retired versions: rollout_loop.py) that also ends the run on a failing reward."""

    def __init__(self, *, heartbeat_value: Any, model_version_value: Any, **kwargs: Any):
        """TRL's loop; agrpo gives it the shared values without their locks (the heartbeat held back while a reward
        runs), and a loop TRL cannot build (a chat template it does not know) reports why and exits, where TRL's
        raised."""
        self._progress = ProgressHeartbeat(heartbeat_value.get_obj())
        # agrpo's own references to the channels it passes (TRL keeps them in private attributes)
        self.failure_queue, self.figures_queue = kwargs["exception_info_queue"], kwargs["metrics_queue"]
        self.event_loop: asyncio.AbstractEventLoop | None = None  # the running loop and TRL's stop event, once
        self.stop_event: asyncio.Event | None = None  # `_run_loops` starts (TRL passes the event to it)
        self.stop_requested = False
        try:
            super().__init__(
                heartbeat_value=self._progress,
                model_version_value=model_version_value.get_obj(),
                **kwargs,
            )
        except Exception as error:  # e.g. a chat template TRL does not recognise
            log.debug("rollout worker failed to start", exc_info=True)
            report(kwargs["exception_info_queue"], kwargs["failed_event"], error)
            exit_now(kwargs["exception_info_queue"], [kwargs["rollout_buffer"], kwargs["metrics_queue"]])

    def push_figures(self, figures: dict[str, float]) -> None:
        """agrpo's own figures for the trainer's log, on the metrics queue in the shape TRL's public
        `RolloutWorkerProtocol` documents (`{key: float}`); never blocks generation."""
        try:
            self.figures_queue.put_nowait(dict(figures))
        except queue.Full:
            pass

    def request_stop(self) -> None:
        """From the stop watcher's thread: stop on the event loop, now if it runs, else as soon as it starts."""
        self.stop_requested = True
        if self.event_loop is not None:
            try:
                self.event_loop.call_soon_threadsafe(self.stop_now)
            except RuntimeError:  # the loop already closed: nothing left to stop
                pass

    def stop_now(self) -> None:
        """The trainer stopped (training ended): TRL's loops would wait for every request in flight, which took a
        slow model (SmolLM2 on a CPU) past TRL's 15 s before it terminated the process; nobody trains on those
        samples any more, so the loops are cancelled."""
        self.stop_event.set()
        self._stopping = True
        for task in getattr(self, "_loop_tasks", []):
            task.cancel()

    async def _run_loops(self, stop_event: asyncio.Event) -> None:
        """TRL gathers its two loops; agrpo swallows only its own stop's cancellation and cancels and awaits every
        task left before TRL closes the event loop."""
        self._loop_tasks: list[asyncio.Task] = []
        self._stopping = False
        self.stop_event, self.event_loop = stop_event, asyncio.get_running_loop()
        if self.stop_requested:  # the trainer stopped before the loop ran
            self.stop_now()
        try:
            await super()._run_loops(stop_event)
        except asyncio.CancelledError:
            if not self._stopping:  # cancelled by anything but the stop: not ours to swallow
                raise
        finally:  # whatever is left, cancelled and awaited before TRL closes the event loop
            current = asyncio.current_task()
            pending = [task for task in asyncio.all_tasks() if task is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _sibling_safe(self, loop: Any, stop_event: asyncio.Event) -> None:
        """Run one of TRL's two loops; when it fails, cancel the other first, so that its requests end as
        cancelled rather than as retried "Server disconnected" errors once TRL closes the HTTP session."""
        self._loop_tasks.append(asyncio.current_task())
        try:
            await loop(stop_event=stop_event)
        except Exception:
            for task in self._loop_tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            raise

    async def _generate_loop(self, stop_event: asyncio.Event) -> None:
        """TRL's generation loop; when it fails, agrpo cancels the score loop first (`_sibling_safe`)."""
        await self._sibling_safe(super()._generate_loop, stop_event)

    async def _score_loop(self, stop_event: asyncio.Event) -> None:
        """TRL's score loop; when it fails, agrpo cancels the generation loop first (`_sibling_safe`)."""
        await self._sibling_safe(super()._score_loop, stop_event)

    async def _score_group(self, group: Any) -> Any:
        """TRL's scoring; agrpo holds the heartbeat at its start while it runs, counts unscored completions (ending
        the run when nothing can train) and reports the oldest open adapter version."""
        self._progress.scoring_since = time.time()  # one group is scored at a time (TRL's score loop awaits each)
        try:
            samples = await super()._score_group(group)
        finally:
            self._progress.scoring_since = None
            self._progress.value = time.time()
        self._count_unscored(group, samples)
        self.push_figures({OPEN_VERSION_METRIC: float(self.open_version_floor())})
        return samples

    def open_version_floor(self) -> int:
        """The oldest version an open rollout started on (the newest version when none is open): no request below it
        can start again, so the trainer may delete those versions' files (agrpo/trainer/adapter_retention.py)."""
        open_versions = [v for v, n in self.__dict__.get("_open_versions", {}).items() if n > 0]
        return min(open_versions, default=self.model_version)

    def _count_unscored(self, group: Any, samples: list[Any]) -> None:
        """Completions no reward scored: counted, warned about once, and the run ended when group after group has
        nothing to train on (agrpo/rewards/unscored.py)."""
        if not samples:  # a group dropped unscored (a retired adapter version): nothing was scored
            return
        tally = self.__dict__.setdefault("_unscored", UnscoredTally(getattr(self, "reward_func_names", ())))
        rewards, index = [], 0
        for sequences in group.completions_sequences:  # the samples' order: each completion's rows, in turn
            if sequences:
                rewards.append(samples[index].metrics["reward"])
                index += len(sequences)
        row = describe_row({"prompts": group.prompts, **group.reward_kwargs})
        warning = tally.add(rewards, row)  # raises RewardError: TRL's score loop reports it and the run ends
        if warning:
            log.warning("%s", warning)
        left_out = sum(1 for r in rewards if r != r)  # NaN: every term returned None
        if left_out:
            self.push_figures({UNSCORED_METRIC: float(left_out)})

    async def _generate_one(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        """TRL's episode; agrpo counts the adapter versions open rollouts use and names the row of a failure
        (`RowError`), where TRL raised the bare error."""
        opened = self.__dict__.setdefault("_open_versions", collections.Counter())
        version = self.model_version  # its requests use this version or a newer one (each turn asks the current one)
        opened[version] += 1
        try:
            return await super()._generate_one(prompt, *args, **kwargs)
        except Exception as error:  # CancelledError is not an Exception: cancellation passes through
            raise RowError(row_failure(prompt, error)) from error
        finally:
            opened[version] -= 1

    def run(self) -> None:
        """TRL's run, which reports a failure and re-raises; agrpo then exits the child at once (`exit_now`)."""
        try:
            super().run()  # on failure TRL reports it (queue + event) and logs the traceback (trainer.log only)
        except BaseException:
            exit_now(self.failure_queue, [self.rollout_buffer, self.figures_queue])
