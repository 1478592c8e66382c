"""The local launcher's fleet controller (inference.replicas=auto), built from the plan: the spare replicas as
processes, the proxy's URL and admin token, the policy's knobs (agrpo/fleet/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from collections.abc import Callable
from typing import Any

from agrpo.config.schema.inference import FleetConfig
from agrpo.fleet.controller import FleetController
from agrpo.fleet.policy import Knobs
from agrpo.launchers.plan import Plan
from agrpo.processes.managed import ManagedProcess
from agrpo.launchers.standby_spare import StandbyProcess
from agrpo.proxy.settings import ADMIN_TOKEN_ENV


_DEFAULTS = FleetConfig()


def console(line: str) -> None:
    """The fleet's lines go to the console, for people (each change, with its reason)."""
    print(line, flush=True)


def fleet_setting(policy: dict[str, Any], key: str) -> Any:
    """inference.fleet.<key> from the plan's policy record (it holds every key, as floats; a record written before a
    key existed gets FleetConfig's default), in FleetConfig's type."""
    default = getattr(_DEFAULTS, key)
    return type(default)(policy.get(key, default))


def policy_knobs(plan: Plan) -> Knobs:
    fleet = plan.fleet
    assert fleet is not None
    given = {
        f.name: fleet_setting(fleet.policy, f.name) for f in dataclasses.fields(Knobs) if hasattr(_DEFAULTS, f.name)
    }
    return Knobs(min_replicas=fleet.min_replicas, max_replicas=fleet.max_replicas, **given)


def controller_settings(policy: dict[str, Any]) -> dict[str, Any]:
    """The controller's own inference.fleet.* keys (the policy's are in its Knobs)."""
    return {key: fleet_setting(policy, key) for key in ("poll_s", "drain_timeout_s", "settle_steps")}


def fleet_controller(plan: Plan, replicas: list[Any], started: list[Any], tenants_of: str = "") -> FleetController:
    """`replicas`: the list the replica supervisor keeps up (added replicas join it); `started`: what the launcher
    stops at the end (a spare is appended before it starts); `tenants_of`: a shared fleet's name (`agrpo fleet up`),
    whose controller sizes it on its tenants' combined steps (agrpo/fleet/files.py TenantSteps) instead of a run's."""
    fleet = plan.fleet
    assert fleet is not None
    build = getattr(fleet, "build_controller", None)
    if build is not None:  # replica Jobs (the trainer Job's fleet: agrpo/launchers/hf_jobs/fleet_jobs.py)
        return build(plan, replicas, started)
    proxy = next(spec for spec in plan.services if spec.role == "proxy")
    if fleet_setting(fleet.policy, "standby"):
        spares = stand_by(plan, started, console)
    else:
        spares = [ManagedProcess(s.name, s.argv, s.env, Path(s.log_path or ""), s.health_url) for s in fleet.spares]
    return FleetController(
        run_dir=plan.run_dir,
        proxy_url=f"http://127.0.0.1:{proxy.port}",
        admin_token=proxy.env[ADMIN_TOKEN_ENV],
        spares=spares,
        supervised=replicas,
        started=started,
        knobs=policy_knobs(plan),
        **controller_settings(fleet.policy),
        startup_timeout_s=plan.supervision.startup_timeout_s,
        inflight_ceiling=fleet.inflight_ceiling,
        say=console,
        price_per_hour=fleet_setting(fleet.policy, "replica_price_per_hour"),
        price_source="inference.fleet.replica_price_per_hour",
        tenants_of=tenants_of,
    )


def stand_by(plan: Plan, started: list[Any], say: Callable[[str], None]) -> list[StandbyProcess]:
    """Launch every spare as a standby (inference.fleet.standby): it imports vLLM now and serves once added. Each is in
    `started` from its launch, so the launcher stops it however the run ends."""
    assert plan.fleet is not None
    spares = []
    for spec in plan.fleet.spares:
        go = Path(plan.run_dir) / "fleet" / f"{spec.name}.go"
        spare = StandbyProcess(spec.name, spec.argv, spec.env, Path(spec.log_path or ""), spec.health_url, go_path=go)
        started.append(spare)
        spare.stand_by()
        spares.append(spare)
    if spares:
        names = ", ".join(spare.name for spare in spares)
        say(f"agrpo fleet: {names} standing by (it imports vLLM now and holds no device until added)")
    return spares
