"""launcher=local: vLLM replicas (+ agrpo's proxy when there are several) as child processes, then the trainer.

Every child gets its own process group and carries the run's marker (AGRPO_RUN_TOKEN). The launcher stops them all
on success, failure, Ctrl-C, SIGTERM or SIGHUP (a closed terminal); once it is stopping, further signals are noted
and ignored until every child is gone. If the launcher itself is killed, its watchdog stops them
(agrpo/processes/watchdog.py). Ports stay reserved for the run's life (agrpo/processes/ports.py).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from dataclasses import asdict
from typing import Any

from agrpo.config.resolve import inflight_slots
from agrpo.config.schema import FleetConfig, ProxySettings, RunConfig
from agrpo.config.spec import spec_yaml
from agrpo.config.schema.trainer import is_auto
from agrpo.errors import LaunchError
from agrpo.inference.replica_guard import REPLICA_KEY_ENV
from agrpo.inference.vllm_server import build_replica_launch
from agrpo.launchers.base import Launcher, register
from agrpo.config.schema.inference import fleet_bounds, is_auto_fleet
from agrpo.cpus import TRAINER_CPUS_ENV, CpuSplit, format_cores, split_fleet_cores
from agrpo.launchers.gpus import assign_gpus, one_process_trainer_gpus, to_physical, visible_devices
from agrpo.launchers.plan import FleetPlan, ModelStep, Plan, ProcessSpec, Supervision
from agrpo.processes.ports import PortReservation, reserve_ports
from agrpo.processes.managed import ManagedProcess, SignalGuard, stop_all
from agrpo.config.launch_checks import refuse_mixed_outputs
from agrpo.launchers.fleet_run import fleet_controller
from agrpo.launchers.supervise import ReplicaSupervisor, wait_supervised
from agrpo.trainer.trainer_error import TRAINER_ERROR_ENV, clear_trainer_error, trainer_error_file, trainer_failure
from agrpo.processes.watchdog import RUN_TOKEN_ENV, run_token
from agrpo.proxy.settings import ADMIN_TOKEN_ENV
from agrpo.models.resolve import prepare_model

log = logging.getLogger(__name__)
RESOLVED_CONFIG = "config.yaml"


def is_loopback_url(url: str) -> bool:
    """A replica given by URL on this machine (e.g. started by hand) pins a core like one the plan starts."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def share_cpu_cores(cfg: RunConfig, cpu_ids: Sequence[int], pinned_replicas: int, most_replicas: int = 0) -> CpuSplit:
    """This process's cores shared out: each replica the plan starts on CPU pins its own, the trainer has the rest
    (a replica on this machine that the plan does not start takes one too). With a fleet that grows to
    `most_replicas`, the replica slots are those of the largest fleet (agrpo/cpus.py)."""
    inference = cfg.inference
    return split_fleet_cores(
        cpu_ids,
        pinned_replicas,
        max(most_replicas, pinned_replicas),
        inference.cpu_cores_per_replica,
        cfg.trainer.cpu_threads,
        unpinned_replicas=sum(map(is_loopback_url, inference.urls)),
    )


def split_gpus(
    cfg: RunConfig, replicas: int, num_gpus: int, visible_gpus: list[str] | None
) -> tuple[list[int | str] | None, list[list[int]] | None, str | None]:
    """(the trainer's GPUs by machine id, each replica's GPU indices, a note on GPUs left idle) for this machine;
    `replicas`: how many this machine may start (0: they run elsewhere; an auto fleet's most)."""
    trainer_gpus, replica_gpus = None, None
    if replicas:
        trainer_gpus, replica_gpus = assign_gpus(
            num_gpus, replicas, cfg.inference.gpus_per_replica, cfg.trainer.gpus, cfg.inference.gpus
        )
    elif num_gpus > 0:  # replicas run elsewhere (e.g. inside a trainer Job): every GPU here is the trainer's
        trainer_gpus = list(cfg.trainer.gpus) if cfg.trainer.gpus else list(range(num_gpus))
    trainer_gpus, idle_note = one_process_trainer_gpus(trainer_gpus, str(cfg.launcher.name), bool(cfg.trainer.gpus))
    return to_physical(trainer_gpus, visible_gpus), replica_gpus, idle_note


def build_local_plan(
    cfg: RunConfig,
    run_dir: str,
    ports: list[int],
    device: str,
    num_gpus: int,
    cpu_ids: Sequence[int],
    python: str = sys.executable,
    admin_token: str = "",
    visible_gpus: list[str] | None = None,
    replica_key: str = "",
) -> Plan:
    """The local plan (pure). `ports` must hold replicas + 1 free ports (the last one for the proxy); `cpu_ids` are
    the cores this process may use; `visible_gpus` is this process's CUDA_VISIBLE_DEVICES as a list (None: unset),
    through which the children's GPUs are named. `replica_key`: the API key of the replicas the plan starts, given
    to the proxy (its upstream token) or, without a proxy, to the trainer (agrpo/inference/replica_guard.py)."""
    inference = cfg.inference
    logs = Path(run_dir) / "logs"
    services: list[ProcessSpec] = []
    upstreams = list(inference.urls)
    fleet = None
    starts_replicas = cfg.role == "all" and not upstreams
    fewest, most = fleet_bounds(inference) if starts_replicas else (0, 0)
    cpus = share_cpu_cores(cfg, cpu_ids, *((fewest, most) if device == "cpu" else (0, 0)))
    trainer_gpus, replica_gpus, idle_note = split_gpus(cfg, most, num_gpus, visible_gpus)
    if starts_replicas:
        slots = [
            replica_spec(cfg, i, ports[i], device, gpus, trainer_gpus, cores, python, logs, replica_key)
            for i, gpus, cores in slot_devices(most, replica_gpus, visible_gpus, cpus)
        ]
        services += slots[:fewest]
        upstreams += [spec.health_url.removesuffix("/health") for spec in slots[:fewest]]  # the replicas' URLs
        fleet = fleet_plan(cfg, slots, fewest) if is_auto_fleet(inference) else None
    vllm_url = upstreams[0] if upstreams else ""
    token_env: dict[str, str] = {}
    if cfg.inference.use_proxy:
        keyed = starts_replicas and bool(replica_key)
        proxy = proxy_spec(cfg, ports[-1], upstreams, python, logs, admin_token, replica_key if keyed else "")
        services.append(proxy)
        vllm_url = f"http://127.0.0.1:{proxy.port}"
        token_env = {ADMIN_TOKEN_ENV: admin_token}  # state changes need it; only the trainer gets it besides the proxy
    direct_key = replica_key if starts_replicas and not cfg.inference.use_proxy else ""  # it talks to its one replica
    trainer = trainer_spec(run_dir, vllm_url, len(upstreams), trainer_gpus, token_env, direct_key, device, cpus, python)
    return Plan(
        launcher="local",
        run_dir=run_dir,
        services=services,
        trainer=trainer,
        vllm_url=vllm_url,
        notes=[f"device={device}, {num_gpus} GPU(s)", *([idle_note] if idle_note else [])],
        resume=str(cfg.trainer.resume),
        model=ModelStep(str(cfg.model.name_or_path), cfg.model.builder or None),
        supervision=supervision(cfg, services),
        fleet=fleet,
    )


def slot_devices(
    slots: int, replica_gpus: list[list[int]] | None, visible_gpus: list[str] | None, cpus: CpuSplit
) -> list[tuple[int, list[int] | None, list[int] | None]]:
    """(index, GPUs, cores) of each replica slot."""
    return [
        (
            index,
            to_physical(replica_gpus[index], visible_gpus) if replica_gpus else None,
            cpus.replica_cores[index] if cpus.replica_cores else None,
        )
        for index in range(slots)
    ]


def fleet_plan(cfg: RunConfig, slots: list[ProcessSpec], fewest: int) -> FleetPlan:
    """inference.replicas=auto: the slots beyond the first `fewest` are started on demand by the fleet controller."""
    ceiling = inflight_slots(cfg.trainer) if is_auto(cfg.trainer.max_inflight_tasks) else None
    return FleetPlan(fewest, len(slots), slots[fewest:], fleet_policy_knobs(cfg.inference.fleet), ceiling)


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
    port: int,
    device: str,
    gpus: list[int] | None,
    trainer_gpus: list[int] | None,
    cpu_cores: list[int] | None,
    python: str,
    logs: Path,
    api_key: str = "",
) -> ProcessSpec:
    """Replica `index` of the plan (agrpo/inference/vllm_server.py has its flags)."""
    shared = bool(gpus and trainer_gpus and set(gpus) & set(trainer_gpus))
    launch = build_replica_launch(
        cfg, port, device, gpus, python, shares_gpu_with_trainer=shared, cpu_cores=cpu_cores, api_key=api_key or None
    )
    return ProcessSpec(
        name=f"vllm-{index}",
        role="replica",
        argv=launch.argv,
        env=launch.env,
        port=launch.port,
        health_url=f"{launch.url}/health",
        log_path=str(logs / f"vllm-{index}.log"),
        gpus=gpus,
    )


def proxy_spec(
    cfg: RunConfig, port: int, upstreams: list[str], python: str, logs: Path, admin_token: str, replica_key: str
) -> ProcessSpec:
    """agrpo's proxy in front of `upstreams`. State changes need the admin token (agrpo/trainer/seam/module_patches.py sends
    it); with `replica_key` (replicas this plan starts) the replicas' API key is its upstream token, which the
    trainer never holds."""
    argv = [python, "-m", "agrpo.proxy", "--port", str(port), "--host", "127.0.0.1"]
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


def supervision(cfg: RunConfig, services: Sequence[ProcessSpec]) -> Supervision:
    """Replicas are restarted only behind a proxy (it routes around a dead one meanwhile: agrpo/launchers/supervise.py)."""
    restarts = bool(cfg.inference.restart_on_failure) and any(s.role == "proxy" for s in services)
    return Supervision(
        startup_timeout_s=float(cfg.inference.startup_timeout_s),
        restart_replicas=restarts,
        max_restarts=int(cfg.inference.max_restarts),
        stop_timeout_s=float(cfg.launcher.stop_timeout_s),
    )


def proxy_knob_flags(proxy_cfg: ProxySettings, skip: Sequence[str] = ()) -> list[str]:
    """CLI flags for every proxy knob that differs from its default (upstreams/host/port are set by the plan, and so
    are the knobs named in `skip`)."""
    from dataclasses import fields

    from agrpo.proxy.settings import flag_name

    defaults = ProxySettings()
    flags = []
    for knob in fields(ProxySettings):
        if knob.name in ("upstreams", "host", "port", "admin_token_env", *skip):
            continue
        value = getattr(proxy_cfg, knob.name)
        if value == getattr(defaults, knob.name) or value is None:
            continue
        if isinstance(value, bool):  # on/off flags take no value (argparse's BooleanOptionalAction)
            flags.append(f"--{'' if value else 'no-'}{flag_name(knob.name)}")
        else:
            flags += [f"--{flag_name(knob.name)}", str(value)]
    return flags


_HELD_FOR_PROCESS: list[PortReservation] = []  # reservations nobody releases early: kept until this process ends


def plan_on_this_machine(cfg: RunConfig, run_dir: str, reservations: list[PortReservation] | None = None) -> Plan:
    """The local plan for this machine: its GPUs (as CUDA_VISIBLE_DEVICES exposes them), ports reserved for this run
    (appended to `reservations` for the caller to release; by default held until the process ends) and the CPU
    cores this process may use. The replicas serve on the spec's inference.device (prepare resolved it)."""
    import torch

    num_gpus = torch.cuda.device_count()
    device = str(cfg.inference.device)
    most = fleet_bounds(cfg.inference)[1]
    reservation = reserve_ports(most + 1, cfg.inference.base_port, cfg.inference.host)
    (reservations if reservations is not None else _HELD_FOR_PROCESS).append(reservation)
    return build_local_plan(
        cfg,
        run_dir,
        reservation.ports,
        device,
        num_gpus,
        sorted(os.sched_getaffinity(0)),
        admin_token=secrets.token_urlsafe(32),
        visible_gpus=visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")),
        replica_key=secrets.token_urlsafe(32),  # per run: replicas take requests only from this run's proxy/trainer
    )


def start_services(plan: Plan, startup_timeout_s: float, started: list[ManagedProcess]) -> list[ManagedProcess]:
    """Start the plan's replicas, wait until they are healthy, then its proxy: the one executor of local services,
    shared by the local and accelerate launchers, the in-Job trainer and `agrpo eval`. Each process is appended to
    `started` before it starts, so the caller's teardown stops whatever a signal or a failure interrupted."""
    services = [ManagedProcess(s.name, s.argv, s.env, Path(s.log_path), s.health_url) for s in plan.services]
    for role in ("replica", "proxy"):
        group = [p for p, s in zip(services, plan.services) if s.role == role]
        for process in group:
            log.info("starting %s (log: %s)", process.name, process.log_path)
            started.append(process)  # before start: a signal in between must not lose it
            process.start()
        t0 = time.monotonic()
        for process in group:
            remaining = startup_timeout_s - (time.monotonic() - t0)
            process.wait_healthy(max(remaining, 1.0))
        if group:
            log.info("%d %s(s) healthy after %.0f s", len(group), role, time.monotonic() - t0)
    return services


@register
class LocalLauncher(Launcher):
    name = "local"

    def __init__(self) -> None:
        self.reservations: list[PortReservation] = []  # the plan's ports, held until execute ends

    def build_plan(self, cfg: RunConfig) -> Plan:
        plan = plan_on_this_machine(cfg, cfg.sync.output_dir, self.reservations)
        plan.files[RESOLVED_CONFIG] = spec_yaml(cfg)  # what every process of the run reads (load_spec)
        return plan

    def execute(self, plan: Plan) -> dict[str, Any]:
        """Run `plan` and only it (it carries the run-dir check, the model step, the files, the processes and their
        supervision; what the dry run printed)."""
        run_dir = Path(plan.run_dir)
        refuse_mixed_outputs(run_dir, plan.resume)
        run_dir.mkdir(parents=True, exist_ok=True)
        if plan.model is not None:
            prepare_model(plan.model)
        for name, text in plan.files.items():
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / name).write_text(text)
        log.info("this run's processes carry %s=%s in their environment", RUN_TOKEN_ENV, run_token())
        started: list[ManagedProcess] = []
        with SignalGuard() as guard:
            try:
                services = start_services(plan, plan.supervision.startup_timeout_s, started)
                clear_trainer_error(run_dir)
                trainer = ManagedProcess(plan.trainer.name, plan.trainer.argv, plan.trainer.env)
                started.append(trainer)
                trainer.start(inherit_output=True)
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
                return json.loads((run_dir / "metrics.json").read_text())
            except KeyboardInterrupt as stop:
                guard.teardown()
                name = getattr(stop, "signame", "SIGINT")
                raise LaunchError(
                    f"interrupted; every process was stopped (the launcher got {name}). Outputs so far are in {run_dir}"
                ) from None
            finally:
                guard.teardown()
                stop_all(list(reversed(started)), plan.supervision.stop_timeout_s)
                for reservation in self.reservations:
                    reservation.release()
                self.reservations.clear()
