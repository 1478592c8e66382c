"""The only code that knows TRL: the trainer process (`python -m agrpo.trainer`) around TRL 1.16's AsyncGRPOTrainer.

Laid out by concern (docs/architecture.md, "trainer/ layout"):
- seam/: agrpo's subclasses of TRL's trainer and vLLM client and the few module attributes replaced where TRL offers
  no hook; also what is served to TRL or to the model it loads (packed attention, the FSDP untie).
- sync/: how a published adapter version reaches the replicas without a pause, and the run's lease on a shared fleet.
- console/: what the run tells a person: the terminal, trainer.log, the end summary, metrics.json.
- rollout/: the rollout side: agrpo's rollout worker (TRL's public `rollout_worker=` hook), its child process, the
  guard, the pacing, and agrpo's own rollout loop with its parts (no TRL class subclassed).
- here: the trainer process (__main__.py), building it from the run spec (trl_backend.py), its one-paragraph error
  (trainer_error.py, disk_full.py, disk_full_quiet.py), the fleet's signals (fleet_signals.py).
"""
