"""Child processes of a run, shared by the launchers, the replicas' helpers and evaluation: start in their own group,
wait healthy, stop the whole group (managed.py); the watchdog that stops them if the launcher is killed
(watchdog.py); ports reserved for a run's life (ports.py)."""
