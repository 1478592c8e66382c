"""launcher=local: vLLM replicas (+ agrpo's proxy when there are several) as child processes, then the trainer.

Every child gets its own process group and carries the run's marker (AGRPO_RUN_TOKEN). The launcher stops them all
on success, failure, Ctrl-C, SIGTERM or SIGHUP (a closed terminal); once it is stopping, further signals are noted
and ignored until every child is gone. If the launcher itself is killed, its watchdog stops them
(agrpo/processes/watchdog.py). The plan names its ports and secrets; the executor reserves and makes them when it
runs the plan, and the ports stay reserved for the run's life (agrpo/launchers/binding.py, agrpo/processes/ports.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from dataclasses import asdict, replace
from typing import Any

from agrpo.config.schema import FleetConfig, RunConfig
from agrpo.config.spec import spec_yaml
from agrpo.config.schema.trainer import is_auto
from agrpo.errors import LaunchError
from agrpo.inference.replica_guard import REPLICA_KEY_ENV
from agrpo.inference.standby import STANDBY_MODULE
from agrpo.inference.vllm_server import build_replica_launch
from agrpo.launchers.base import Launcher, register
from agrpo.config.schema.inference import fleet_bounds, is_auto_fleet
from agrpo.cpus import TRAINER_CPUS_ENV, CpuSplit, format_cores
from agrpo.launchers.gpus import visible_devices
from agrpo.launchers.machine import share_cpu_cores, slot_devices, split_gpus, trainer_start
from agrpo.launchers.binding import bound
from agrpo.launchers.plan import (
    FleetPlan,
    ModelStep,
    Placeholders,
    Plan,
    PortGroup,
    ProcessSpec,
    Supervision,
    port_placeholder,
    secret_placeholder,
)
from agrpo.processes.managed import ManagedProcess, SignalGuard, stop_all
from agrpo.config.launch_checks import refuse_mixed_outputs
from agrpo.launchers.fleet_run import fleet_controller
from agrpo.launchers.shared_fleet import attach, attached_tenant
from agrpo.launchers.supervise import ReplicaSupervisor, wait_supervised
from agrpo.trainer.trainer_error import (
    TRAINER_ERROR_ENV,
    clear_trainer_error,
    trainer_error_file,
    trainer_failure,
    trainer_still_running,
)
from agrpo.processes.watchdog import RUN_TOKEN_ENV, run_token
from agrpo.interprocess import read_metrics
from agrpo.proxy.settings import ADMIN_TOKEN_ENV, proxy_knob_flags
from agrpo.models.resolve import prepare_model

log = logging.getLogger(__name__)
RESOLVED_CONFIG = "config.yaml"
PROXY = "proxy"  # the proxy's port, by name (the replicas' are their names: vllm-0, ...)
ADMIN_TOKEN = "proxy-admin-token"  # the proxy's admin token, for the proxy and the trainer
REPLICA_KEY = "replica-key"  # the API key of the replicas this run starts, for the proxy (or the one trainer)


def build_local_plan(
    cfg: RunConfig,
    run_dir: str,
    device: str,
    num_gpus: int,
    cpu_ids: Sequence[int],
    python: str = sys.executable,
    visible_gpus: list[str] | None = None,
) -> Plan:
    """The local plan (pure: it reserves no port and makes no secret; `local_placeholders` names those, and the
    executor binds them). `cpu_ids` are the cores this process may use; `visible_gpus` is this process's
    CUDA_VISIBLE_DEVICES as a list (None: unset), through which the children's GPUs are named. The replicas the plan
    starts serve only requests carrying the run's replica key, which the proxy holds (its upstream token) or, without
    a proxy, the trainer (agrpo/inference/replica_guard.py)."""
    inference = cfg.inference
    logs = Path(run_dir) / "logs"
    services: list[ProcessSpec] = []
    upstreams = list(inference.urls)
    fleet = None
    starts_replicas = cfg.role == "all" and not upstreams
    fewest, most = fleet_bounds(inference) if starts_replicas else (0, 0)
    cpus = share_cpu_cores(cfg, cpu_ids, *((fewest, most) if device == "cpu" else (0, 0)))
    trainer_gpus, replica_gpus, idle_note = split_gpus(cfg, most, num_gpus, visible_gpus)
    replica_key = secret_placeholder(REPLICA_KEY) if starts_replicas else ""
    slots: list[ProcessSpec] = []
    if starts_replicas:
        slots = [
            replica_spec(cfg, i, device, gpus, trainer_gpus, cores, python, logs, replica_key)
            for i, gpus, cores in slot_devices(most, replica_gpus, visible_gpus, cpus)
        ]
        services += slots[:fewest]
        upstreams += [spec.health_url.removesuffix("/health") for spec in slots[:fewest]]  # the replicas' URLs
        fleet = fleet_plan(cfg, slots, fewest) if is_auto_fleet(inference) else None
    vllm_url = upstreams[0] if upstreams else ""
    token_env: dict[str, str] = {}
    if cfg.inference.use_proxy:
        admin_token = secret_placeholder(ADMIN_TOKEN)
        proxy = proxy_spec(cfg, upstreams, python, logs, admin_token, replica_key)
        services.append(proxy)
        vllm_url = f"http://127.0.0.1:{proxy.port}"
        token_env = {ADMIN_TOKEN_ENV: admin_token}  # state changes need it; only the trainer gets it besides the proxy
    direct_key = "" if cfg.inference.use_proxy else replica_key  # without a proxy it talks to its one replica
    trainer = trainer_spec(run_dir, vllm_url, len(upstreams), trainer_gpus, token_env, direct_key, device, cpus, python)
    return Plan(
        launcher="local",
        run_dir=run_dir,
        services=services,
        trainer=trainer,
        vllm_url=vllm_url,
        notes=[f"device={device}, {num_gpus} GPU(s)", *([idle_note] if idle_note else [])],
        resume=str(cfg.trainer.resume),
        model=ModelStep(str(cfg.model.name_or_path), cfg.model.builder or None, cfg.model.builder_input),
        supervision=supervision(cfg, services, trainer_start(cfg, trainer_gpus, slots)),
        fleet=fleet,
        placeholders=local_placeholders(cfg, most),
    )


def local_placeholders(cfg: RunConfig, slots: int) -> Placeholders:
    """The ports (each of the `slots` replicas', spares included, then the proxy's) and the secrets (the proxy's
    admin token, the replicas' key) the local plan names: made when it runs, fresh for each run."""
    proxy = bool(cfg.inference.use_proxy)
    names = [replica_name(index) for index in range(slots)] + ([PROXY] if proxy else [])
    ports = [PortGroup(names, int(cfg.inference.base_port), str(cfg.inference.host))] if names else []
    return Placeholders(ports, [ADMIN_TOKEN] * proxy + [REPLICA_KEY] * bool(slots))


def replica_name(index: int) -> str:
    return f"vllm-{index}"


def fleet_plan(cfg: RunConfig, slots: list[ProcessSpec], fewest: int) -> FleetPlan:
    """inference.replicas=auto: the slots beyond the first `fewest` are started on demand by the fleet controller;
    with inference.fleet.standby, through agrpo's standby module (it imports the server's, then waits)."""
    ceiling = cfg.trainer.inflight_slots if is_auto(cfg.trainer.max_inflight_tasks) else None
    spares = slots[fewest:]
    if cfg.inference.fleet.standby:
        spares = [replace(spec, argv=standby_argv(spec.argv)) for spec in spares]
    return FleetPlan(fewest, len(slots), spares, fleet_policy_knobs(cfg.inference.fleet), ceiling)


def standby_argv(argv: list[str]) -> list[str]:
    """`<python> -m <server module> ARGS` -> `<python> -m agrpo.inference.standby <server module> ARGS`."""
    python, flag, module, *args = argv
    assert flag == "-m", argv
    return [python, "-m", STANDBY_MODULE, module, *args]


def fleet_policy_knobs(fleet_cfg: FleetConfig) -> dict[str, float]:
    """inference.fleet.* as the plan carries them (the dry run prints them; the fleet controller reads them)."""
    return {key: float(value) for key, value in asdict(fleet_cfg).items()}


def trainer_spec(
    run_dir: str,
    vllm_url: str,
    upstreams: int,
    gpus: list[int] | None,
    token_env: dict[str, str],
    replica_key: str,
    device: str,
    cpus: CpuSplit,
    python: str,
) -> ProcessSpec:
    """The trainer process: the resolved config it reads, the URL it talks to, its GPUs or CPU threads, the proxy's
    admin token (`token_env`) or its one replica's API key, and where it leaves its one-paragraph error."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else {}
    env.update(token_env)
    if replica_key:
        env[REPLICA_KEY_ENV] = replica_key
    env[TRAINER_ERROR_ENV] = str(trainer_error_file(run_dir))  # shown by execute
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(cpus.trainer_threads)
        if cpus.trainer_cores:
            env[TRAINER_CPUS_ENV] = format_cores(cpus.trainer_cores)
    config = str(Path(run_dir) / RESOLVED_CONFIG)
    argv = [python, "-m", "agrpo.trainer", config, "--vllm-url", vllm_url, "--num-replicas", str(max(upstreams, 1))]
    return ProcessSpec(name="trainer", role="trainer", env=env, gpus=gpus, argv=argv)


def replica_spec(
    cfg: RunConfig,
    index: int,
    device: str,
    gpus: list[int] | None,
    trainer_gpus: list[int] | None,
    cpu_cores: list[int] | None,
    python: str,
    logs: Path,
    api_key: str = "",
) -> ProcessSpec:
    """Replica `index` of the plan, on its port's placeholder (agrpo/inference/vllm_server.py has its flags)."""
    name = replica_name(index)
    shared = bool(gpus and trainer_gpus and set(gpus) & set(trainer_gpus))
    launch = build_replica_launch(
        cfg,
        port_placeholder(name),
        device,
        gpus,
        python,
        shares_gpu_with_trainer=shared,
        cpu_cores=cpu_cores,
        api_key=api_key or None,
    )
    return ProcessSpec(
        name=name,
        role="replica",
        argv=launch.argv,
        env=launch.env,
        port=launch.port,
        health_url=f"{launch.url}/health",
        log_path=str(logs / f"{name}.log"),
        gpus=gpus,
    )


def proxy_spec(
    cfg: RunConfig, upstreams: list[str], python: str, logs: Path, admin_token: str, replica_key: str
) -> ProcessSpec:
    """agrpo's proxy in front of `upstreams`, on its port's placeholder. State changes need the admin token
    (agrpo/trainer/seam/module_patches.py sends it); with `replica_key` (replicas this plan starts) the replicas' API
    key is its upstream token, which the trainer never holds."""
    port = port_placeholder(PROXY)
    argv = [python, "-m", "agrpo.proxy", "--port", port, "--host", "127.0.0.1"]
    for url in upstreams:
        argv += ["--upstream", url]
    argv += proxy_knob_flags(cfg.proxy, skip=("token_env",) if replica_key else ())
    argv += ["--admin-token-env", ADMIN_TOKEN_ENV]
    env = {ADMIN_TOKEN_ENV: admin_token}
    if replica_key:
        argv += ["--token-env", REPLICA_KEY_ENV]
        env[REPLICA_KEY_ENV] = replica_key
    return ProcessSpec(
        name="proxy",
        role="proxy",
        argv=argv,
        port=port,
        env=env,
        health_url=f"http://127.0.0.1:{port}/health",
        log_path=str(logs / "proxy.log"),
    )


def supervision(cfg: RunConfig, services: Sequence[ProcessSpec], start: tuple[bool, str] = (False, "")) -> Supervision:
    """Replicas are restarted only behind a proxy (it routes around a dead one meanwhile: agrpo/launchers/supervise.py).
    `start`: whether the trainer starts while the replicas boot, or why it waits (`trainer_start`)."""
    restarts = bool(cfg.inference.restart_on_failure) and any(s.role == "proxy" for s in services)
    return Supervision(
        startup_timeout_s=float(cfg.inference.startup_timeout_s),
        restart_replicas=restarts,
        max_restarts=int(cfg.inference.max_restarts),
        stop_timeout_s=float(cfg.launcher.stop_timeout_s),
        trainer_during_boot=start[0],
        trainer_waits_because=start[1],
    )


def plan_on_this_machine(cfg: RunConfig, run_dir: str) -> Plan:
    """The local plan for this machine: its GPUs (as CUDA_VISIBLE_DEVICES exposes them) and the CPU cores this
    process may use; its ports and secrets stay placeholders until it is executed (agrpo/launchers/binding.py). The
    replicas serve on the spec's inference.device (prepare resolved it)."""
    import torch

    return build_local_plan(
        cfg,
        run_dir,
        str(cfg.inference.device),
        torch.cuda.device_count(),
        sorted(os.sched_getaffinity(0)),
        visible_gpus=visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")),
    )


def start_services(
    plan: Plan,
    startup_timeout_s: float,
    started: list[ManagedProcess],
    while_booting: Callable[[], Callable[[], None]] | None = None,
) -> list[ManagedProcess]:
    """Start the plan's replicas, wait until they are healthy, then its proxy: the one executor of local services,
    shared by the local and accelerate launchers, the in-Job trainer and `agrpo eval`. Each process is appended to
    `started` before it starts, so the caller's teardown stops whatever a signal or a failure interrupted. `plan` is
    a bound one (agrpo/launchers/binding.py: `bound`). `while_booting` runs once the replicas are started (it starts
    the trainer) and returns a check run while waiting, which raises if what it started failed."""
    if plan.placeholders.names():
        raise ValueError(f"the plan still names {plan.placeholders.names()}: bind it first (binding.bound)")
    services = [ManagedProcess(s.name, s.argv, s.env, Path(s.log_path), s.health_url) for s in plan.services]
    check = None
    for role in ("replica", "proxy"):
        group = [p for p, s in zip(services, plan.services) if s.role == role]
        for process in group:
            log.info("starting %s (log: %s)", process.name, process.log_path)
            started.append(process)  # before start: a signal in between must not lose it
            process.start()
        if role == "replica" and while_booting is not None:
            check = while_booting()
        t0 = time.monotonic()
        for process in group:
            remaining = startup_timeout_s - (time.monotonic() - t0)
            process.wait_healthy(max(remaining, 1.0), check=check)
        if group:
            log.info("%d %s(s) healthy after %.0f s", len(group), role, time.monotonic() - t0)
    return services


@register
class LocalLauncher(Launcher):
    name = "local"

    def build_plan(self, cfg: RunConfig) -> Plan:
        if cfg.inference.shared_fleet:  # a tenant of a running fleet: the trainer only (launchers/shared_fleet.py)
            plan = attach(cfg, plan_on_this_machine)
        else:
            plan = plan_on_this_machine(cfg, cfg.sync.output_dir)
        plan.files[RESOLVED_CONFIG] = spec_yaml(cfg)  # what every process of the run reads (load_spec)
        return plan

    def execute(self, plan: Plan) -> dict[str, Any]:
        """Run `plan` and only it (it carries the run-dir check, the model step, the files, the processes and their
        supervision; what the dry run printed), with its ports reserved and its secrets made now, held until the
        run ends."""
        run_dir = Path(plan.run_dir)
        refuse_mixed_outputs(run_dir, plan.resume)
        with bound(plan) as bound_plan, attached_tenant(bound_plan) as running:  # registered on a shared fleet
            run_dir.mkdir(parents=True, exist_ok=True)
            if running.model is not None:
                prepare_model(running.model)
            for name, text in running.files.items():
                (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (run_dir / name).write_text(text)
            log.info("this run's processes carry %s=%s in their environment", RUN_TOKEN_ENV, run_token())
            return run_processes(running)


def run_processes(plan: Plan) -> dict[str, Any]:
    """Start the bound plan's services and trainer, keep them up as its supervision says, and stop every one of them
    however the run ends; the trainer's metrics, or a LaunchError saying why the run ended."""
    run_dir = Path(plan.run_dir)
    started: list[ManagedProcess] = []
    trainer = ManagedProcess(plan.trainer.name, plan.trainer.argv, plan.trainer.env)

    def start_trainer() -> Callable[[], None]:
        clear_trainer_error(run_dir)
        started.append(trainer)
        trainer.start(inherit_output=True)
        return lambda: trainer_still_running(trainer, run_dir)

    with SignalGuard() as guard:
        try:
            early = plan.supervision.trainer_during_boot
            services = start_services(
                plan, plan.supervision.startup_timeout_s, started, start_trainer if early else None
            )
            if trainer not in started:
                start_trainer()
            replicas = [p for p, s in zip(services, plan.services) if s.role == "replica"]
            watch = plan.supervision
            supervisor = (
                ReplicaSupervisor(replicas, watch.max_restarts) if watch.restart_replicas and replicas else None
            )
            fleet = fleet_controller(plan, replicas, started) if plan.fleet else None
            try:
                code = wait_supervised(trainer, supervisor, **({"fleet": fleet} if fleet else {}))
            finally:
                if fleet is not None:
                    print(fleet.finish(), flush=True)
            if code != 0:
                raise LaunchError(trainer_failure(run_dir, code))
            return read_metrics(run_dir / "metrics.json")
        except KeyboardInterrupt as stop:
            guard.teardown()
            name = getattr(stop, "signame", "SIGINT")
            raise LaunchError(
                f"interrupted; every process was stopped (the launcher got {name}). Outputs so far are in {run_dir}"
            ) from None
        finally:
            guard.teardown()
            trainer_first = [trainer] if trainer in started else []  # then the services, the last started first
            stop_all(
                trainer_first + [p for p in reversed(started) if p is not trainer], plan.supervision.stop_timeout_s
            )
