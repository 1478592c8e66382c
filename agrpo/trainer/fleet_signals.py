"""inference.replicas=auto: the trainer's side of the fleet (agrpo/fleet/). Each logged step appends the signals the
launcher's fleet policy reads to <output_dir>/fleet/steps.jsonl (`FleetSignals`); every log carries the fleet's size
and replica-seconds as the controller last wrote them (`fleet/replicas`, `fleet/replica_seconds`: TensorBoard,
log_history), given to the trainer's `add_log_figures` (agrpo/trainer/seam/trainer.py) by trl_backend."""

from __future__ import annotations

import time
from transformers import TrainerCallback

from agrpo.fleet.files import append_step
from agrpo.fleet.signals import STEP_KEYS, STEP_S


class FleetSignals(TrainerCallback):
    """Writes one line per step with TRL's figures as logged (on_log sees the whole entry), from the main process only."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or STEP_S not in logs or not state.is_world_process_zero:
            return  # under accelerate every rank logs the same step: one line per step, from rank 0
        entry = {key: logs[key] for key in STEP_KEYS if logs.get(key) is not None}
        append_step(self.output_dir, {"t": time.time(), "step": state.global_step, **entry})
