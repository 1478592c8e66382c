"""The rollout side: agrpo's rollout worker, handed to TRL 1.16 through its public `rollout_worker=` hook, and the
child process it runs (no TRL class is subclassed here; docs/architecture.md has the picture).

Trainer process: worker.py (TRL's `RolloutWorkerProtocol`), process.py (the child's channels, spawn, stop),
guard.py (a failure, death or hang -> one paragraph), pacing.py + inflight.py + control.py (the in-flight budget the
trainer sets). Rollout child: entry.py (set-up), loop.py (the loop, composed of): admission.py (when a rollout may
start), episode.py (one conversation) with client.py (HTTP to the proxy), toolbox.py (tools, environments) and
sequences.py (turns -> training rows), scorer.py (rewards -> RolloutSamples), figures.py (the metrics queue),
child.py (heartbeat, failure report, exit). Nothing here imports TRL at package import.
"""
