"""Checks of a run that attaches to a shared fleet (inference.shared_fleet, issue 43; docs/shared_fleet.md).

`shared_fleet_problems` (pure, in the validation pass): the run's own settings. A shared fleet is never paused by one
run, so sync.mode must be background; the local launcher attaches runs so far; the fleet is always behind its proxy.
`attach_problems` (pure): the run against the fleet's record, which the local launcher reads when it plans the run
(agrpo/launchers/shared_fleet.py: the record lives in agrpo/fleet/, and agrpo/fleet imports agrpo/config, so this
package must not import it back): the base model, max_model_len, lora.r against the fleet's LoRA rank, and the
adapter versions one run keeps against the fleet's slots. A mismatch is a ConfigError (exit 2) before any process
starts, dry run included.
"""

from __future__ import annotations

from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.config.schema.choices import SyncMode


def shared_knob_problems(cfg: Any) -> list[str]:
    """inference.shared.* are usable numbers (a fleet's, and a run's lease)."""
    shared = cfg.inference.shared
    problems = []
    if shared.max_tenants < 1:
        problems.append("inference.shared.max_tenants must be >= 1 (runs a fleet takes at once)")
    if not shared.lease_s >= 2.0:
        problems.append(
            f"inference.shared.lease_s={shared.lease_s} must be >= 2 seconds: a run renews its lease every lease_s/4 "
            "s, and a shorter lease lapses under an ordinary pause of the machine"
        )
    return problems


def shared_fleet_problems(cfg: Any) -> list[str]:
    """With inference.shared_fleet: what the run itself must be to share a fleet."""
    problems = shared_knob_problems(cfg)
    name = cfg.inference.shared_fleet
    if not name:
        return problems
    where = f"inference.shared_fleet={name}"
    if str(cfg.sync.mode) != SyncMode.background.value:
        problems.append(
            f"{where} needs sync.mode=background (sync.mode={cfg.sync.mode}): a blocking sync pauses the replicas, "
            "and a shared fleet is never paused by one run, since every other run on it would stop generating"
        )
    if cfg.launcher.name != "local":
        problems.append(
            f"{where} attaches runs with launcher=local so far (launcher={cfg.launcher.name}): drop "
            "inference.shared_fleet, or run with launcher=local"
        )
    if cfg.role != "all":
        problems.append(f"{where} needs role=all (role={cfg.role}): the fleet is the run's replicas")
    if cfg.inference.use_proxy is False:
        problems.append(f"{where}: a shared fleet is always behind its proxy; drop inference.use_proxy=false")
    return problems


def ignored_notes(cfg: Any) -> list[str]:
    """What a run attached to a fleet does not use (printed with its plan)."""
    inference = cfg.inference
    notes = []
    if str(inference.replicas) != "1":
        notes.append(f"inference.replicas={inference.replicas} is ignored: the fleet's replicas serve this run")
    if inference.urls:
        notes.append("inference.urls is ignored: the run talks to the fleet's proxy")
    return notes


def attach_problems(cfg: Any, fleet: Any, run_model: str) -> list[str]:
    """The run against the fleet's record (pure; `run_model`: the run's model as the fleet records its own, a local
    folder by its real path): each mismatch names both sides and what to change."""
    name = fleet.name
    problems = []
    if run_model != fleet.model:
        problems.append(
            f"the fleet {name} serves the model {fleet.model}, and this run trains {run_model} (model.name_or_path): "
            f"attach it to a fleet of its model (`agrpo fleet up NAME +recipe=...` with this run's model), or run it "
            "without inference.shared_fleet"
        )
    if cfg.inference.max_model_len > fleet.max_model_len:
        problems.append(
            f"inference.max_model_len={cfg.inference.max_model_len} exceeds the fleet {name}'s max_model_len="
            f"{fleet.max_model_len}: its replicas would refuse this run's longest prompts and completions; lower "
            "inference.max_model_len, or start the fleet with a larger one"
        )
    if cfg.lora.r > fleet.max_lora_rank:
        problems.append(
            f"lora.r={cfg.lora.r} exceeds the fleet {name}'s max_lora_rank={fleet.max_lora_rank}: its replicas cannot "
            f"load this run's adapters; lower lora.r, or start the fleet with inference.max_lora_rank >= {cfg.lora.r}"
        )
    versions, slots = int(cfg.inference.max_loras), fleet.max_tenants * fleet.versions_per_tenant
    if versions > slots:
        problems.append(
            f"this run keeps up to {versions} adapter versions loaded (trainer.max_staleness + 2), more than the "
            f"{slots} LoRA slots of the fleet {name}: lower trainer.max_staleness, or start the fleet with a larger "
            "inference.shared.max_tenants"
        )
    return problems


def attached_spec(spec: RunConfig) -> RunConfig:
    """A run on a shared fleet talks to the fleet's proxy: the spec says so (inference.use_proxy), so that its
    trainer treats the URL as one (adapter retention, the serving figures)."""
    if not spec.inference.shared_fleet or spec.inference.use_proxy:
        return spec
    from agrpo.config.spec import with_values

    return with_values(spec, {"inference.use_proxy": True})
