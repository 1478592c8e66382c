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

    def render(self) -> str:
        parts = [f"agrpo plan ({self.launcher}), run dir {self.run_dir}", f"trainer talks to {self.vllm_url}"]
        parts += [f"note: {note}" for note in self.notes]
        parts += [f"[file] {self.run_dir}/{name}  ({len(text.encode())} bytes)" for name, text in self.files.items()]
        parts += [spec.render() for spec in [*self.services, self.trainer]]
        return "\n".join(parts)
