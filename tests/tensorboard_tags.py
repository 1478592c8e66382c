"""Reading a run's TensorBoard scalars in the e2e tests (the names docs/console.md and docs/your_task.md give)."""

from __future__ import annotations

from pathlib import Path


def tensorboard_tags(run_dir: Path) -> set[str]:
    """The scalar tags of every TensorBoard event file under the run's `tensorboard/` folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in (Path(run_dir) / "tensorboard").rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags().get("scalars", []))
    return tags
