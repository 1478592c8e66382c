"""launcher=hf_jobs: vLLM replica Jobs and a trainer Job on Hugging Face Jobs, sharing a Storage Bucket.

plan.py (the plan as data), planner.py (config -> plan; what is refused before anything starts is in
agrpo/config/hf_jobs_checks.py), inputs.py (this machine's model/data, carried through the bucket), package.py and
repack.py (the wheel of the launching code), executor.py (runs a plan), ready.py (replica readiness), client.py (Hub
calls), trainer.py (inside the trainer Job), cli.py (`agrpo jobs`), pull.py (`agrpo pull`), cost.py, after.py,
terminal.py and outcome.py (what the launching machine shows and prints at the end), hub.py (the Hub backend a launch
runs on: the Hub, or a local stand-in of it, and the one place that picks it). Importing this registers the launcher.
"""

from agrpo.launchers.hf_jobs.launcher import HFJobsLauncher

__all__ = ["HFJobsLauncher"]
