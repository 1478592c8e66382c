"""The local launcher's fleet controller (inference.replicas=auto), built from the plan: the spare replicas as
processes, the proxy's URL and admin token, the policy's knobs (agrpo/fleet/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agrpo.config.schema.inference import FleetConfig
from agrpo.fleet.controller import FleetController
from agrpo.fleet.policy import Knobs
from agrpo.launchers.plan import Plan
from agrpo.processes.managed import ManagedProcess
from agrpo.proxy.settings import ADMIN_TOKEN_ENV


def policy_knobs(plan: Plan) -> Knobs:
    fleet = plan.fleet
    assert fleet is not None
    names = {f.name for f in dataclasses.fields(Knobs)}
    given = {key: value for key, value in fleet.policy.items() if key in names}
    for key in ("window_steps", "recent_steps"):
        given[key] = int(given.get(key, getattr(Knobs, key)))
    return Knobs(min_replicas=fleet.min_replicas, max_replicas=fleet.max_replicas, **given)


def controller_settings(policy: dict[str, Any]) -> dict[str, Any]:
    """The controller's own inference.fleet.* keys from the plan's policy record (which holds every key; the
    defaults are FleetConfig's, for a record written before a key existed)."""
    defaults = FleetConfig()
    return {
        "poll_s": float(policy.get("poll_s", defaults.poll_s)),
        "drain_timeout_s": float(policy.get("drain_timeout_s", defaults.drain_timeout_s)),
        "settle_steps": int(policy.get("settle_steps", defaults.settle_steps)),
    }


def fleet_controller(plan: Plan, replicas: list[Any], started: list[Any]) -> FleetController:
    """`replicas`: the list the replica supervisor keeps up (added replicas join it); `started`: what the launcher
    stops at the end (a spare is appended before it starts)."""
    fleet = plan.fleet
    assert fleet is not None
    build = getattr(fleet, "build_controller", None)
    if build is not None:  # replica Jobs (the trainer Job's fleet: agrpo/launchers/hf_jobs/fleet_jobs.py)
        return build(plan, replicas, started)
    proxy = next(spec for spec in plan.services if spec.role == "proxy")
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
        say=lambda line: print(line, flush=True),
        price_per_hour=float(fleet.policy.get("replica_price_per_hour", FleetConfig().replica_price_per_hour)),
        price_source="inference.fleet.replica_price_per_hour",
    )
