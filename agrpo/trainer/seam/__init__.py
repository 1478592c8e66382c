"""agrpo's seam with TRL 1.16's AsyncGRPOTrainer: every change of TRL's behaviour is an overridden method of one of
agrpo's subclasses, each with a docstring saying what TRL does and why agrpo differs (docs/architecture.md has the
whole table):

- trainer.py: `AgrpoAsyncGRPOTrainer(AsyncGRPOTrainer)`: agrpo's rollout worker through TRL's public
  `rollout_worker=` hook (agrpo/trainer/rollout/worker.py; it and the loop its child runs subclass nothing of TRL's),
  the client below, the background sync with the logic it needs, the rollout position in checkpoints, log figures,
  pacing, adapter retention.
- client.py: `AgrpoVLLMClient(VLLMClient)`: adapter loads that wait for the store, serve first and feed retention.
- module_patches.py: the few names of TRL's modules replaced because TRL offers nothing to override (CPU
  workarounds, packed attention, the admin token on TRL's HTTP calls, the model fix at load, the deferred rmtree,
  the client class TRL builds).
- cpu_compat.py: what lets TRL's trainer run without CUDA (MFU accounting off, where TRL asks CUDA unconditionally),
  applied by module_patches.py only where it is needed.
- attention.py: the packed attention served to TRL in place of FA3's kernel (SDPA, varlen causal) and the trainer's
  choice between them; fsdp_compat.py: the FSDP2 untie of tied embeddings, applied to the model TRL loads.

The logic each override calls stays in its own module (rollout/guard.py, rollout/pacing.py, sync/retention.py,
sync/mode.py, sync/background.py). Every private TRL name used is listed in agrpo/trl_compat.py and checked when a run
is prepared. Nothing here is imported by `agrpo.trainer.seam` itself: importing TRL is the caller's choice.
"""
