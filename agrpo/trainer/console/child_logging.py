"""The rollout child's logging, when nobody set it up: everything to the trainer's log file, nothing to the terminal.
Its own module, so that it imports neither TRL nor torch (agrpo/trainer/rollout_loop.py calls it in the child)."""

from __future__ import annotations

import logging


def log_to_trainer_log(path: str | None) -> None:
    """In the rollout child: every logger (TRL's warnings included) to the trainer's log file, nothing to the
    terminal (Python's last-resort handler would print warnings there). Nothing to do when the child's logging is
    set up already (by whoever started it): TRL's retry warnings are then kept off the console by name
    (agrpo/trainer/console/logs.py, HARMLESS)."""
    if not path or logging.getLogger().handlers:
        return
    from agrpo.trainer.console.logs import FILE_FORMAT, _route_transformers_logging

    _route_transformers_logging()  # transformers' own stderr handler too
    handler = logging.FileHandler(path, encoding="utf-8")  # appends, as the trainer does
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
