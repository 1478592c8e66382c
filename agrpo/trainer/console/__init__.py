"""What a training run tells the person watching it: the terminal, trainer.log, the end summary and metrics.json.

Why a folder of its own: this is read by people, never by TRL, and none of it may change what is trained. Most of it
is pure (a step's logged figures in, lines out) and tested on real log values; the callback only feeds it.

- callback.py: `ConsoleCallback` (the start banner, the progress bar, a step line every `logger.console_every`
  steps, the end summary with the next commands) and `quiet_trainer` (transformers' per-step dict printers removed).
- events.py: what happens to the serving side (a hung replica, retired versions), one line per kind of event.
- notices.py: one line, once, when the figures say a run is not learning or an episode was cut short.
- bottleneck.py: which side of the async pipeline is slow, how much is thrown away as stale, which knob to turn.
- serving_metrics.py: the proxy's routing and the replicas' prefix-cache figures, logged beside TRL's.
- final_metrics.py: the run's figures for metrics.json, read from the trainer's log history.
- logs.py: where every library's output goes (trainer.log in full, the terminal filtered, known-harmless lines kept
  off it with their reason); the rollout child's own logging is set up by rollout/entry.py.
"""
