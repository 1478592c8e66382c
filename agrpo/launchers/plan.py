"""A launch plan is plain data: which processes a run starts, with their commands, env names, ports and GPUs.

Launchers build a plan from the config (pure, unit-tested) and an executor runs it. `launcher.dry_run=true` prints
it. Env values are shown only for names in SAFE_ENV_VALUES; anything else (tokens) appears by name only.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

SAFE_ENV_VALUES = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_CPU_KVCACHE_SPACE",
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "OMP_NUM_THREADS",
    "OMP_PLACES",
    "OMP_PROC_BIND",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_LOGGING_LEVEL",
}


@dataclass
class ProcessSpec:
    name: str
    role: str  # "replica" | "proxy" | "trainer"
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int | None = None
    health_url: str | None = None
    log_path: str | None = None
    gpus: list[int] | None = None

    def render(self) -> str:
        env = " ".join(f"{k}={v if k in SAFE_ENV_VALUES else '<set>'}" for k, v in sorted(self.env.items()))
        lines = [
            f"[{self.role}] {self.name}"
            + (f"  port={self.port}" if self.port else "")
            + (f"  gpus={self.gpus}" if self.gpus is not None else "")
        ]
        if env:
            lines.append(f"  env: {env}")
        lines.append(f"  cmd: {shlex.join(self.argv)}")
        if self.log_path:
            lines.append(f"  log: {self.log_path}")
        return "\n".join(lines)


@dataclass
class ModelStep:
    """Model preparation before any process starts (agrpo/models/resolve.py): build it with `builder`, or check that
    `name_or_path` is there (a local folder, or a Hub id in the cache when offline)."""

    name_or_path: str
    builder: str | None = None

    def render(self) -> str:
        if self.builder:
            return f"[model] build {self.name_or_path} with {self.builder}"
        return f"[model] check {self.name_or_path} is there"


@dataclass
class Supervision:
    """How the executor waits for, keeps up and stops the plan's processes (inference.startup_timeout_s,
    inference.restart_on_failure + max_restarts, launcher.stop_timeout_s)."""

    startup_timeout_s: float = 600.0
    restart_replicas: bool = False  # a replica that dies is started again (behind a proxy only) ...
    max_restarts: int = 0  # ... at most this many times each
    stop_timeout_s: float = 30.0

    def render(self) -> str:
        restarts = (
            f"restart a dead replica up to {self.max_restarts} time(s)" if self.restart_replicas else "no restarts"
        )
        return (
            f"[supervision] services healthy within {self.startup_timeout_s:g} s; {restarts}; "
            f"each process group stopped within {self.stop_timeout_s:g} s"
        )


@dataclass
class FleetPlan:
    """inference.replicas=auto: the plan starts `min_replicas`; the launcher's fleet controller (agrpo/fleet/) starts
    the `spares` (replicas min_replicas..max_replicas-1, keyed and bound like the others) and releases them as its
    policy (`policy`, inference.fleet.*) decides."""

    min_replicas: int
    max_replicas: int
    spares: list[ProcessSpec] = field(default_factory=list)
    policy: dict[str, float] = field(default_factory=dict)
    inflight_ceiling: int | None = None  # trainer.max_inflight_tasks=auto: the most requests the budget may reach

    def render(self) -> str:
        knobs = ", ".join(f"{key}={value:g}" for key, value in self.policy.items())
        lines = [
            f"[fleet] auto: {self.min_replicas}..{self.max_replicas} replicas; starts {self.min_replicas}, adds or "
            f"releases one at a time from the run's signals ({knobs})"
        ]
        lines += [
            spec.render().replace("\n", "\n  ").replace(f"] {spec.name}", f"] {spec.name} (on demand)", 1)
            for spec in self.spares
        ]
        return "\n".join(lines)


@dataclass
class Plan:
    launcher: str
    run_dir: str
    services: list[ProcessSpec]  # started first and kept up while the trainer runs (replicas, proxy)
    trainer: ProcessSpec
    vllm_url: str  # what the trainer talks to: the only replica, or the proxy
    notes: list[str] = field(default_factory=list)
    # Files the executor writes into the run dir before any process starts (path relative to it -> content): the
    # resolved run config every process reads, the accelerate/FSDP config. The dry run lists them.
    files: dict[str, str] = field(default_factory=dict)
    # trainer.resume: the run dir may hold an earlier run's outputs only when it continues that run (checked first).
    resume: str = "false"
    model: ModelStep | None = None  # prepared before any process starts
    supervision: Supervision = field(default_factory=Supervision)
    fleet: FleetPlan | None = None  # inference.replicas=auto

    def render(self) -> str:
        parts = [f"agrpo plan ({self.launcher}), run dir {self.run_dir}", f"trainer talks to {self.vllm_url}"]
        parts += [f"note: {note}" for note in self.notes]
        parts.append(
            f"[run dir] refuse an earlier run's outputs unless trainer.resume continues it (resume={self.resume})"
        )
        parts += [self.model.render()] if self.model else []
        parts.append(self.supervision.render())
        parts += [f"[file] {self.run_dir}/{name}  ({len(text.encode())} bytes)" for name, text in self.files.items()]
        parts += [spec.render() for spec in [*self.services, self.trainer]]
        parts += [self.fleet.render()] if self.fleet else []
        return "\n".join(parts)
