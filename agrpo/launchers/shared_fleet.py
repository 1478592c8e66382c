"""launcher=local with inference.shared_fleet=NAME: the run is a tenant of a running fleet (`agrpo fleet up NAME`).

Its plan is the local plan of a run whose one server is the fleet's proxy: the trainer only, no replica, no proxy of
its own. The fleet's record (agrpo/fleet/registry.py) is read when the plan is built, and the run is checked against
it there (agrpo/config/shared_fleet_checks.py: exit 2 naming the mismatch, dry run included, before any process).
When the plan runs, `attached_tenant` registers the run (`POST /fleet/tenants` with the fleet's admin token, which
only the record and the proxy hold) before the trainer starts, hands the trainer its tenant id (AGRPO_TENANT), its
token (AGRPO_PROXY_ADMIN_TOKEN, the variable the trainer already sends as its bearer token) and its lease
(AGRPO_TENANT_LEASE_S), renews the lease while the run is up (the trainer renews it too, once it has started), and
unregisters it (`DELETE /fleet/tenants/<id>`: its adapters unloaded) however the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.config.shared_fleet_checks import attach_problems, ignored_notes
from agrpo.config.spec import with_values
from agrpo.errors import AgrpoError, ConfigError, LaunchError
from agrpo.fleet.files import remove_tenant, write_tenant
from agrpo.fleet.registry import FleetRecord, load_fleet, model_identity, read_fleet
from agrpo.fleet.tenancy import TENANT_RE, tenant_api_call
from agrpo.interprocess import BadInput, number, parse_record, record, text
from agrpo.launchers.plan import Plan, secret_placeholder, substitute
from agrpo.proxy.settings import ADMIN_TOKEN_ENV

log = logging.getLogger(__name__)
TENANT_ENV = "AGRPO_TENANT"  # the trainer's side: agrpo/trainer/sync/tenant_lease.py
LEASE_ENV = "AGRPO_TENANT_LEASE_S"
TENANT_TOKEN = secret_placeholder("tenant-token")  # bound at registration, never made by the plan's binding
TENANT_ID = "<tenant>"
REGISTERED = record({"tenant": text, "token": text, "prefix": text, "lease_s": number}, required=("tenant", "token"))
# Set by a dry-run sweep that would start fleet NAME (agrpo/sweep_fleet.py): its points plan without its record.
SWEEP_STARTS_FLEET_ENV = "AGRPO_SWEEP_STARTS_FLEET"
TOKEN_RE = re.compile(r"[\x21-\x7e]{16,512}")  # printable, no space: it goes into an environment variable


@dataclass
class AttachedPlan(Plan):
    """The local plan of a run on a shared fleet: which fleet, and what the run registers with."""

    shared_fleet: str = ""
    tenant_request: dict[str, Any] = field(default_factory=dict)  # POST /fleet/tenants's body

    def render(self) -> str:
        lines = super().render().splitlines()
        ask = self.tenant_request
        attach = (
            f"[shared fleet] {self.shared_fleet} at {self.vllm_url}: registers as a tenant (run {ask['run']}, "
            f"{ask['versions']} adapter versions, LoRA rank {ask['lora_rank']}, lease {ask['lease_s']:g} s) before "
            "the trainer starts, unregisters when it ends"
        )
        return "\n".join([*lines[:2], attach, *lines[2:]])


def attached_plan(cfg: RunConfig, fleet: FleetRecord, build: Callable[[RunConfig, str], Plan]) -> AttachedPlan:
    """The plan (pure, given `build`: the local plan builder of this machine): the trainer alone, its URL the
    fleet's proxy, its tenant id and token bound at registration."""
    one_server = with_values(
        cfg, {"inference.urls": [fleet.url], "inference.use_proxy": False, "inference.replicas": 1}
    )
    plan = build(one_server, str(cfg.sync.output_dir))
    lease_s = float(cfg.inference.shared.lease_s)
    env = {**plan.trainer.env, ADMIN_TOKEN_ENV: TENANT_TOKEN, TENANT_ENV: TENANT_ID, LEASE_ENV: f"{lease_s:g}"}
    trainer = dataclasses.replace(plan.trainer, env=env)
    request = {
        "run": str(cfg.run_name),
        "lease_s": lease_s,
        "versions": int(cfg.inference.max_loras),
        "lora_rank": int(cfg.lora.r),
    }
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    fields.update(trainer=trainer, notes=[*plan.notes, *ignored_notes(cfg)])
    return AttachedPlan(**fields, shared_fleet=fleet.name, tenant_request=request)


def planned_fleet(cfg: RunConfig) -> FleetRecord:
    """What a dry-run sweep's points plan against when the sweep would start their fleet (pure): no record exists yet,
    so its URL is a placeholder and the run is not checked against it (the sweep starts the fleet from its own
    overrides, with its largest lora.r and trainer.max_staleness: agrpo/sweep_fleet.py, so every point fits it)."""
    name = str(cfg.inference.shared_fleet)
    return FleetRecord(
        name=name,
        url=f"<URL of fleet {name} once the sweep started it>",
        admin_token="",
        model=model_identity(str(cfg.model.name_or_path)),
        max_model_len=int(cfg.inference.max_model_len),
        max_lora_rank=int(cfg.lora.r),
        max_tenants=int(cfg.inference.shared.max_tenants),
        versions_per_tenant=int(cfg.inference.max_loras),
        pid=0,
        pgid=0,
        started_at=0.0,
        run_dir="",
        uid=0,
    )


def sweep_would_start(name: str) -> bool:
    """Whether this process is a point of a dry-run sweep that would start fleet `name` (agrpo/sweep_fleet.py sets
    SWEEP_STARTS_FLEET_ENV in the sweep's process before its points start, so a joblib worker inherits it) and no
    fleet of that name runs: a missing record is then no error."""
    return os.environ.get(SWEEP_STARTS_FLEET_ENV) == name and load_fleet(name) is None


def attach(cfg: RunConfig, build: Callable[[RunConfig, str], Plan]) -> AttachedPlan:
    """The fleet's record read and the run checked against it (ConfigError, exit 2), then the plan. A dry-run sweep's
    point whose fleet the sweep would start plans against the fleet to be (`planned_fleet`)."""
    name = str(cfg.inference.shared_fleet)
    if cfg.launcher.dry_run and sweep_would_start(name):
        plan = attached_plan(cfg, planned_fleet(cfg), build)
        plan.notes.append(
            f"fleet {name} is not up: the sweep starts it before its points run (dry run: nothing was started), and "
            "this run is checked against its record then"
        )
        return plan
    fleet = read_fleet(name)
    problems = attach_problems(cfg, fleet, model_identity(str(cfg.model.name_or_path)))
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise ConfigError(f"this run cannot attach to the fleet {fleet.name} ({count}): {'; '.join(problems)}.")
    return attached_plan(cfg, fleet, build)


def message_of(raw: bytes) -> str:
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return raw[:300].decode(errors="replace")
    found = answer.get("message") or answer.get("detail") or answer.get("error") if isinstance(answer, dict) else None
    return str(found or answer)[:600]


def register(fleet: FleetRecord, ask: dict[str, Any]) -> dict[str, Any]:
    """The tenant the fleet gives this run ({"tenant", "token", ...}), or LaunchError with the fleet's reason."""
    where = f"the fleet {fleet.name} at {fleet.url}"
    try:
        status, raw = tenant_api_call(f"{fleet.url}/fleet/tenants", "POST", fleet.admin_token, ask)
    except OSError as error:
        raise LaunchError(
            f"{where} does not answer ({getattr(error, 'reason', error)}): `agrpo fleet status` shows whether it runs"
        ) from None
    if status == 409:
        raise LaunchError(f"{where} has no room for this run: {message_of(raw)}")
    if status != 200:
        raise LaunchError(f"{where} refused to register this run (HTTP {status}: {message_of(raw)})")
    try:
        tenant = parse_record(raw, REGISTERED)
        if not TENANT_RE.fullmatch(tenant["tenant"]) or not TOKEN_RE.fullmatch(tenant["token"]):
            raise BadInput("its tenant id or token is malformed")
    except BadInput as error:
        raise LaunchError(f"{where} answered the registration with something unreadable: {error}") from None
    return tenant


def unregister(fleet: FleetRecord, tenant: dict[str, Any]) -> None:
    """DELETE the tenant (its adapters unloaded on every replica); a failure is logged: the lease then lapses."""
    try:
        status, raw = tenant_api_call(f"{fleet.url}/fleet/tenants/{tenant['tenant']}", "DELETE", tenant["token"])
    except OSError as error:
        status, raw = None, str(error).encode()
    if status in (200, 404):  # 404: the fleet had already forgotten it (a lapsed lease)
        log.info("tenant %s unregistered from the fleet %s", tenant["tenant"], fleet.name)
        return
    log.warning(
        "could not unregister tenant %s from the fleet %s (%s): its lease lapses within %g s and the fleet unloads "
        "its adapters then",
        tenant["tenant"],
        fleet.name,
        f"HTTP {status}: {message_of(raw)}" if status else raw.decode(errors="replace"),
        tenant.get("lease_s", 0.0),
    )


def keep_lease(fleet: FleetRecord, tenant: dict[str, Any], every_s: float, stop: threading.Event) -> None:
    """Renew the lease every `every_s` until `stop` (from the registration on: the trainer takes seconds to start
    renewing it itself)."""
    path = f"{fleet.url}/fleet/tenants/{tenant['tenant']}/lease"
    while not stop.wait(every_s):
        try:
            status, _ = tenant_api_call(path, "POST", tenant["token"], {}, timeout_s=every_s)
        except OSError:
            continue
        if status == 404:
            log.warning("the fleet %s forgot tenant %s (its lease lapsed)", fleet.name, tenant["tenant"])
            return


def signal_record(fleet: str, tenant: str, run_dir: str | None) -> None:
    """Write (run_dir) or remove (None) the record by which an elastic fleet's controller reads this run's steps
    (agrpo/fleet/files.py); a failure is logged: the run goes on, only the fleet's sizing does not see it."""
    try:
        if run_dir is None:
            remove_tenant(fleet, tenant)
        else:
            write_tenant(fleet, tenant, run_dir)
    except (OSError, AgrpoError, ValueError) as error:
        log.warning("the fleet %s's record of tenant %s could not be updated: %s", fleet, tenant, error)


@contextlib.contextmanager
def attached_tenant(plan: Plan) -> Iterator[Plan]:
    """`plan` as it runs: for a run on a shared fleet, registered (its tenant id and token bound into the trainer's
    environment) for the block's life and unregistered at its end, whatever the outcome; any other plan as it is."""
    if not isinstance(plan, AttachedPlan):
        yield plan
        return
    fleet = read_fleet(plan.shared_fleet)
    if fleet.url != plan.vllm_url:
        raise LaunchError(
            f"the fleet {fleet.name} now runs at {fleet.url}, not at {plan.vllm_url} where this run was planned (it "
            "was restarted meanwhile): run again"
        )
    tenant = register(fleet, plan.tenant_request)
    log.info("registered with the fleet %s as tenant %s", fleet.name, tenant["tenant"])
    signal_record(fleet.name, tenant["tenant"], plan.run_dir)
    stop = threading.Event()
    every_s = float(plan.tenant_request["lease_s"]) / 4
    threading.Thread(target=keep_lease, args=(fleet, tenant, every_s, stop), daemon=True).start()
    values = {TENANT_TOKEN: tenant["token"], TENANT_ID: tenant["tenant"]}
    try:
        yield substitute(plan, lambda s: values.get(s, s))
    finally:
        stop.set()
        signal_record(fleet.name, tenant["tenant"], None)
        unregister(fleet, tenant)
