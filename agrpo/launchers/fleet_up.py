"""`agrpo fleet up [NAME] +recipe=R [overrides]`: a fleet that outlives a run (issue 43, docs/shared_fleet.md).

The recipe is composed and prepared as a run's (agrpo/config/prepare.py; as for a replica node, without the trainer's
checks), and the local launcher's plan is built from it (agrpo/launchers/local.py: replicas, the proxy, the fleet
controller with inference.replicas=auto) and run without its trainer: the same plan, binding, executor pieces and
teardown. What differs is sized for tenants: every replica gets `--max-loras` = inference.shared.max_tenants x the
versions one run may have loaded (trainer.max_staleness + 2) and `--max-cpu-loras` twice that, and the proxy runs with
`--tenancy`, so runs register, get their own token and adapter namespace, and share the replicas fairly.

Once healthy, the fleet writes its record (agrpo/fleet/registry.py) and prints `fleet NAME ready at URL`; it stays in
the foreground until SIGTERM or SIGINT (`agrpo fleet down NAME`, Ctrl-C), then stops every process it started, removes
its record and writes `<run_dir>/fleet_summary.json`: its replica-seconds and each tenant's share.

With inference.replicas=auto the fleet's controller sizes it on the sum of its tenants' signals: each attached run's
launcher leaves a record of its run dir in the fleet's private tenants directory (agrpo/fleet/files.py), and the
controller reads every such run's steps (docs/shared_fleet.md, "Elastic across tenants").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.config.spec import spec_yaml, with_values
from agrpo.config.vllm_checks import replica_max_num_seqs
from agrpo.errors import AgrpoError, ConfigError, LaunchError
from agrpo.fleet.files import TenantSteps, clear_tenants
from agrpo.fleet.registry import FleetRecord, hold_name, load_fleet, model_identity, remove_fleet, write_fleet
from agrpo.fleet.tenancy import valid_fleet_name
from agrpo.launchers.binding import bound
from agrpo.launchers.fleet_run import fleet_controller
from agrpo.launchers.fleet_ledger import TenantLedger, summary_lines
from agrpo.launchers.local import RESOLVED_CONFIG, plan_on_this_machine, start_services
from agrpo.launchers.plan import Plan
from agrpo.launchers.supervise import ReplicaSupervisor
from agrpo.processes.managed import ManagedProcess, SignalGuard, stop_all
from agrpo.processes.watchdog import start_time
from agrpo.proxy.settings import ADMIN_TOKEN_ENV, ProxySettings

log = logging.getLogger(__name__)
DEFAULT_NAME = "default"
# Set by a sweep that started this fleet (agrpo/sweep_fleet.py): its points. Once that many runs registered and all
# left, the fleet stops itself, as on SIGTERM (its replicas would otherwise idle until the sweep's end reaches it).
STOP_AFTER_ENV = "AGRPO_FLEET_STOP_AFTER_RUNS"
SUMMARY_FILE = "fleet_summary.json"
TENANCY_KNOBS = {field.name for field in dataclasses.fields(ProxySettings)}


def split_argv(argv: list[str]) -> tuple[str, list[str]]:
    """(fleet name, Hydra overrides): the first word is the name unless it is an override (`key=value`, `+key`,
    `~key`)."""
    if argv and "=" not in argv[0] and not argv[0].startswith(("+", "~", "-")):
        return argv[0], argv[1:]
    return DEFAULT_NAME, list(argv)


def fleet_overrides(overrides: list[str]) -> list[str]:
    """The overrides a fleet composes: a run's inference.shared_fleet names the fleet it attaches to, which a fleet is
    not (a sweep starts its fleet with its own overrides: agrpo/sweep_fleet.py)."""
    return [o for o in overrides if o.partition("=")[0].lstrip("+~") != "inference.shared_fleet"]


def fleet_run_dir(name: str, now: float | None = None) -> Path:
    """outputs/fleets/<NAME>/<date_time>_<pid> under the working directory, as Hydra's run dirs are."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
    return Path("outputs", "fleets", name, f"{stamp}_{os.getpid()}").resolve()


def tenant_slots(cfg: RunConfig) -> tuple[int, int]:
    """(versions one tenant may have loaded, LoRA slots of each replica): the run's resolved inference.max_loras
    (trainer.max_staleness + 2 unless set) and max_tenants times that."""
    versions = int(cfg.inference.max_loras)
    return versions, int(cfg.inference.shared.max_tenants) * versions


def fleet_spec(cfg: RunConfig) -> RunConfig:
    """The spec the fleet's replicas and proxy are planned from (pure): LoRA slots for every tenant, always behind the
    proxy, tenancy on (each proxy knob only where the installed proxy has it)."""
    versions, slots = tenant_slots(cfg)
    extra = [str(arg) for arg in cfg.inference.extra_args]
    if not any(arg.split("=")[0] == "--max-cpu-loras" for arg in extra):
        extra += ["--max-cpu-loras", str(2 * slots)]
    changes: dict[str, Any] = {
        "inference.max_loras": slots,
        "inference.extra_args": extra,
        "inference.use_proxy": True,
        "inference.shared_fleet": None,
    }
    proxy = {
        "tenancy": True,
        "max_tenants": int(cfg.inference.shared.max_tenants),
        "max_loras": slots,
        "max_lora_rank": int(cfg.inference.max_lora_rank),
        "tenant_slots_per_replica": replica_max_num_seqs(cfg),  # the fair share divides what the replicas can run
    }
    changes.update({f"proxy.{key}": value for key, value in proxy.items() if key in TENANCY_KNOBS})
    return with_values(cfg, changes)


def without_trainer(plan: Plan) -> Plan:
    """The local plan's services only: its trainer is never started, and nothing waits for it."""
    watch = dataclasses.replace(plan.supervision, trainer_during_boot=False, trainer_waits_because="")
    return dataclasses.replace(plan, supervision=watch, launcher="fleet")


def render_plan(plan: Plan, name: str) -> str:
    """The dry run of `agrpo fleet up`: the local plan's lines but the trainer's."""
    rendered = plan.render().splitlines()
    trainer_at = next(i for i, line in enumerate(rendered) if line.startswith("[trainer] "))
    after = next((i for i in range(trainer_at + 1, len(rendered)) if not rendered[i].startswith("  ")), len(rendered))
    body = [line for line in rendered[2:trainer_at] + rendered[after:] if not line.startswith("[run dir] ")]
    return "\n".join([f"agrpo fleet {name}, run dir {plan.run_dir}", f"serves at {plan.vllm_url}", *body])


def prepared(name: str, overrides: list[str]) -> tuple[RunConfig, Plan]:
    """(the fleet's spec, its plan) from the command line; ConfigError when the name or the config is bad."""
    from agrpo.config.prepare import compose_overrides, prepare

    problem = valid_fleet_name(name)
    if problem:
        raise ConfigError(problem)
    run_dir = fleet_run_dir(name)
    composed = compose_overrides(fleet_overrides(overrides), output_dir=str(run_dir))
    cfg = fleet_spec(prepare(composed, check_environment=False))  # a replica node's checks: no trainer here
    plan = without_trainer(plan_on_this_machine(cfg, str(cfg.sync.output_dir)))
    plan.files[RESOLVED_CONFIG] = spec_yaml(cfg)
    return cfg, plan


def refuse_running(name: str) -> None:
    """A fleet of this name runs already: one paragraph. A stale record (its process gone) is removed."""
    fleet = load_fleet(name)
    if fleet is None:
        return
    if fleet.alive():
        raise ConfigError(
            f"fleet {name} already runs at {fleet.url} (pid {fleet.pid}, run dir {fleet.run_dir}): attach runs with "
            f"inference.shared_fleet={name}, stop it with `agrpo fleet down {name}`, or name another fleet"
        )
    remove_fleet(name, pid=fleet.pid)


def up(name: str, overrides: list[str]) -> int:
    """`agrpo fleet up`: 0 once the fleet ran and was stopped by a signal (or its dry run was printed)."""
    cfg, plan = prepared(name, overrides)
    if cfg.launcher.dry_run:
        print(render_plan(plan, name))
        return 0
    hold_name(name)  # held until this process ends: no second fleet of this name starts meanwhile
    refuse_running(name)
    clear_tenants(name)  # records a killed run left: this fleet's controller counts only runs attached to it
    from agrpo.models.resolve import prepare_model

    run_dir = Path(plan.run_dir)
    with bound(plan) as running:
        run_dir.mkdir(parents=True, exist_ok=True)
        if running.model is not None:
            prepare_model(running.model)
        for file_name, content in running.files.items():
            (run_dir / file_name).write_text(content)
        return serve(running, cfg, name)


def record_of(plan: Plan, cfg: RunConfig, name: str, started_at: float) -> FleetRecord:
    """The fleet's record (`cfg`: the fleet's spec, whose inference.max_loras holds every tenant's slots)."""
    proxy = next(spec for spec in plan.services if spec.role == "proxy")
    return FleetRecord(
        name=name,
        url=plan.vllm_url,
        admin_token=proxy.env[ADMIN_TOKEN_ENV],
        model=model_identity(str(cfg.model.name_or_path)),
        max_model_len=int(cfg.inference.max_model_len),
        max_lora_rank=int(cfg.inference.max_lora_rank),
        max_tenants=int(cfg.inference.shared.max_tenants),
        versions_per_tenant=int(cfg.inference.max_loras) // int(cfg.inference.shared.max_tenants),
        pid=os.getpid(),
        pgid=os.getpgid(0),
        started_at=started_at,
        run_dir=plan.run_dir,
        uid=os.geteuid(),
        pid_start=start_time(os.getpid()),
    )


def serve(plan: Plan, cfg: RunConfig, name: str) -> int:
    """Start the bound plan's services, write the record, keep them up until a signal, stop them all."""
    started: list[ManagedProcess] = []
    proxy_spec = next(spec for spec in plan.services if spec.role == "proxy")
    ledger = TenantLedger(plan.vllm_url, proxy_spec.env[ADMIN_TOKEN_ENV])
    began, ready_at, controller, stopped_by = time.time(), None, None, "an error"
    with SignalGuard() as guard:
        try:
            services = start_services(plan, plan.supervision.startup_timeout_s, started)
            replicas = [p for p, s in zip(services, plan.services) if s.role == "replica"]
            proxy = next(p for p, s in zip(services, plan.services) if s.role == "proxy")
            watch = plan.supervision
            supervisor = ReplicaSupervisor(replicas, watch.max_restarts) if watch.restart_replicas else None
            controller = fleet_controller(plan, replicas, started, tenants_of=name) if plan.fleet else None
            count_gate_waits(controller, ledger)
            ready_at = time.time()
            write_fleet(record_of(plan, cfg, name, ready_at))
            print(f"fleet {name} ready at {plan.vllm_url}", flush=True)
            keep_up(proxy, supervisor, controller, ledger)
        except KeyboardInterrupt as stop:
            stopped_by = getattr(stop, "signame", "SIGINT")
        finally:
            guard.teardown()
            if ready_at is not None:
                ledger.poll(force=True)  # the tenants' last figures, before the proxy stops
            remove_fleet(name, pid=os.getpid())  # no run attaches while it stops
            stop_all(list(reversed(started)), plan.supervision.stop_timeout_s)
            if ready_at is not None:
                finish(plan, name, ledger, controller, (began, ready_at, time.time()), stopped_by)
    if ready_at is None:
        raise LaunchError(f"fleet {name} was stopped ({stopped_by}) before it was ready; every process was stopped")
    return 0


def count_gate_waits(controller: Any, ledger: TenantLedger) -> None:
    """An auto fleet's controller reads its tenants' steps (files.TenantSteps): the time their requests waited at the
    proxy's fair-share gate, from the ledger's reading of GET /fleet/tenants, counts as their starvation too."""
    reader = getattr(controller, "reader", None)
    if isinstance(reader, TenantSteps):
        reader.gate = ledger.gate_waits


def keep_up(proxy: ManagedProcess, supervisor: Any, controller: Any, ledger: TenantLedger, poll_s: float = 1.0) -> None:
    """Until a signal: restart dead replicas, let the controller size the fleet, read the tenants' figures."""
    while True:
        if not proxy.alive():
            raise LaunchError(f"the fleet's proxy exited with code {proxy.exit_code}; see {proxy.log_path}")
        if supervisor is not None:
            supervisor.poll()
        if controller is not None:
            controller.poll()
        ledger.poll()
        if every_run_left(ledger, runs_expected()):
            raise Done(f"its sweep's {runs_expected()} run(s) all left")
        time.sleep(poll_s)


class Done(KeyboardInterrupt):
    """The fleet's work is over (its sweep's runs all left): stopped as on SIGTERM, `signame` saying why."""

    def __init__(self, why: str):
        super().__init__(why)
        self.signame = why


def runs_expected() -> int:
    """STOP_AFTER_ENV's count (0: none, run until a signal)."""
    value = os.environ.get(STOP_AFTER_ENV, "")
    return int(value) if value.isdigit() else 0


def every_run_left(ledger: TenantLedger, expected: int) -> bool:
    """Whether `expected` (> 0) runs registered with the fleet and none is attached any more (pure, on the ledger)."""
    return expected > 0 and len(ledger.tenants) >= expected and all(e.get("gone") for e in ledger.tenants.values())


def finish(
    plan: Plan, name: str, ledger: TenantLedger, controller: Any, times: tuple[float, float, float], stopped_by: str
) -> None:
    """Write fleet_summary.json and print its few lines."""
    import json

    began, ready_at, ended = times
    if controller is not None:
        controller_lines = controller.finish().splitlines()
        replica_seconds = controller.replica_seconds()
    else:
        controller_lines = []
        replica_seconds = sum(s.role == "replica" for s in plan.services) * (ended - began)
    summary = ledger.summary(name, replica_seconds, began, ready_at, ended, stopped_by)
    summary["controller"] = controller_lines
    path = Path(plan.run_dir) / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=1) + "\n")
    for line in summary_lines(summary)[:4] + [f"fleet {name}: summary in {path}"]:
        print(line, flush=True)


def main(argv: list[str]) -> int:
    """`agrpo fleet up` from the fleet CLI: errors as one paragraph."""
    name, overrides = split_argv(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        return up(name, overrides)
    except KeyboardInterrupt:  # before its processes started (they are stopped by `serve` itself)
        print(f"agrpo fleet up: interrupted before fleet {name} started anything", file=sys.stderr, flush=True)
        return 130
    except AgrpoError as error:
        if os.environ.get("AGRPO_DEBUG") == "1":
            raise
        print(f"agrpo fleet up: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
