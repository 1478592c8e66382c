"""The trainer's side of the fleet (agrpo/trainer/fleet_signals.py): each logged step becomes one line of
fleet/steps.jsonl with the policy's figures, and the figures every log carries come from the controller's file
(agrpo/fleet/files.py; the trainer adds them to its logs through `add_log_figures`, tests/trainer/test_seam.py)."""

from __future__ import annotations

from types import SimpleNamespace

from agrpo.fleet import files
from agrpo.trainer.fleet_signals import FleetSignals


def test_steps_are_written_and_fleet_figures_read_from_the_controllers_file(tmp_path):
    signals = FleetSignals(str(tmp_path))
    state = SimpleNamespace(global_step=7, is_world_process_zero=True)
    signals.on_log(None, state, None, logs={"loss": 1.0})  # no perf/step_s: not a step line
    assert files.StepReader(tmp_path).read() == []
    assert files.fleet_figures(str(tmp_path)) == {}  # before the controller wrote anything: no fleet/*
    files.write_state(tmp_path, {"replicas": 2, "replica_seconds": 30.0})
    signals.on_log(None, state, None, logs={"perf/step_s": 2.0, "perf/rollout_wait_s": 1.5, "reward": 0.5})
    (line,) = files.StepReader(tmp_path).read()
    assert line["step"] == 7 and line["perf/step_s"] == 2.0 and line["perf/rollout_wait_s"] == 1.5
    assert "reward" not in line
    figures = files.fleet_figures(str(tmp_path))
    assert figures["fleet/replicas"] == 2.0 and figures["fleet/replica_seconds"] == 30.0


def test_under_accelerate_only_the_main_process_writes_a_step(tmp_path):
    """Every rank logs the same step under launcher=accelerate; the policy must see it once."""
    for rank in range(3):
        state = SimpleNamespace(global_step=4, is_world_process_zero=rank == 0)
        FleetSignals(str(tmp_path)).on_log(None, state, None, logs={"perf/step_s": 1.0, "perf/rollout_wait_s": 0.5})
    assert [line["step"] for line in files.StepReader(tmp_path).read()] == [4]
