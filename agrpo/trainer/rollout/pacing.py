"""The I/O around the in-flight budget: feed the paced rollout loop, measure each step, apply the controller.

`attach_pacing` (main process, before `train()`) hands the rollout loop its control block (through the worker's
`pace`; the loop's side is admission.py) and counts what the trainer takes off the rollout queue
(`AgrpoAsyncGRPOTrainer.pace_with`, agrpo/trainer/seam/trainer.py), and with `trainer.max_inflight_tasks=auto` adds
`PacingCallback`, which feeds each step's logged figures to the pure controller (inflight.py) and writes its budget
where the child reads it. TensorBoard gets `rollout/inflight_target` (the budget in force during the step) and the
child's `rollout/samples_ahead`, `rollout/requests_in_flight`, `rollout/samples_generated_total`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

from agrpo.trainer.rollout.inflight import MAX_WAIT_SHARE, InflightController, Limits, StepFigures
from agrpo.trainer.rollout.control import ControlBlock

log = logging.getLogger(__name__)

TARGET_METRIC = "rollout/inflight_target"


def note_published(trainer: Any, version: int) -> None:
    """Tell the rollout child that `version` is published (it starts no rollout that would be stale on arrival)."""
    block = getattr(trainer, "rollout_control", None)  # the trainer's while it paces (None on other ranks)
    if block is not None:
        block.set("published", version)


def run_limits(args: Any, num_processes: int = 1, max_wait_share: float = MAX_WAIT_SHARE) -> Limits:
    """The controller's limits from TRL's config (samples per step counts every data-parallel rank); it grows the
    budget while the trainer waits more than `max_wait_share` of a step (the run's inference.fleet.release_wait_share,
    so that the fleet can release on a trainer this controller considers fed)."""
    return Limits(
        samples_per_step=args.per_device_train_batch_size * args.gradient_accumulation_steps * num_processes,
        group_size=args.num_generations,
        weight_sync_steps=args.weight_sync_steps,
        max_staleness=args.max_staleness,
        max_wait_share=max_wait_share,
    )


class PacingCallback(TrainerCallback):
    """Each logged step: figures -> controller -> budget in the shared block; the target goes to the next log."""

    def __init__(self, trainer: Any, block: ControlBlock, controller: InflightController):
        self.trainer = trainer
        self.block = block
        self.controller = controller

    def on_step_end(self, args, state, control, **kwargs):
        # before TRL's log() of this step reads (and then clears) its metrics: the budget in force during the step
        self.trainer.record(TARGET_METRIC, float(self.controller.target))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "perf/step_s" not in logs:
            return
        decision = self.controller.observe(StepFigures.from_logs(logs), state.global_step)
        if decision.changed:
            self.block.set("budget", decision.target)
            log.debug(
                "step %d: samples ahead of the trainer now %d (%s)", state.global_step, decision.target, decision.reason
            )


@contextlib.contextmanager
def attach_pacing(
    trainer: Any, auto: bool, max_wait_share: float = MAX_WAIT_SHARE
) -> Iterator[InflightController | None]:
    """Pace a built AgrpoAsyncGRPOTrainer's paced loop for the duration of `train()` (main process only; other ranks
    have no rollout worker). Yields the controller (None with a fixed number of requests in flight)."""
    if getattr(trainer, "rollout_worker", None) is None:
        yield None
        return
    block = ControlBlock.create()
    controller = None
    callback = None
    try:
        trainer.pace_with(block)  # refuses a loop that cannot be paced
        if auto:
            limits = run_limits(trainer.args, trainer.accelerator.num_processes, max_wait_share)
            controller = InflightController(limits)
            block.set("budget", controller.target)
            callback = PacingCallback(trainer, block, controller)
            trainer.add_callback(callback)
            log.debug(
                "samples ahead of the trainer: %d to start, between %d and %d (trainer.max_inflight_tasks=auto)",
                controller.target,
                controller.limits.floor,
                controller.limits.ceiling,
            )
        yield controller
    finally:
        if callback is not None:
            trainer.remove_callback(callback)
        trainer.pace_with(None)
        block.close()
