"""The trainer's side of adapter sync: how each published version reaches the replicas without a pause, and the
run's standing with the fleet that serves them.

Why a folder of its own: TRL 1.16 syncs by pausing every replica; agrpo publishes every version while the replicas
keep generating, and what keeps that safe (no half-written folder, no folder deleted under a request, one name for
one set of weights, a lease that keeps the run's adapters loaded) is several small rules that are easier to test
apart than inside the trainer.

- mode.py: how `sync.mode=background` plugs into TRL's trainer (`BackgroundSyncRun`; the override that calls it is
  seam/trainer.py's `_sync_weight_lora`).
- background.py: the sync thread and its ordering rules (pure functions, the loader injected).
- snapshot.py: a version's tensors copied on the trainer's thread, its files written off it.
- retention.py: a version's files outlive its unload while a request for it can still be inside an engine.
- names.py: a version's folder and the name vLLM serves it under (`<tenant>/trl-policy-vN` on a shared fleet).
- tenant_lease.py: the run as a tenant of a shared fleet: its lease, renewed from a thread, and its share at the end.

Where the adapters are stored (a shared folder, a bucket) is agrpo/sync/, below the config layer; this folder is the
trainer's half. The package imports nothing: importing TRL or torch is the caller's choice.
"""
