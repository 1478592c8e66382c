"""A launch plan is plain data: which processes a run starts, with their commands, env names, ports and GPUs.

Launchers build a plan from the config (pure, unit-tested) and an executor runs it. `launcher.dry_run=true` prints
it. Env values are shown only for names in SAFE_ENV_VALUES; anything else (tokens) appears by name only. The run's
ports and secrets are not in the plan, only their placeholders (`Placeholders`): the executor makes them when it
runs the plan and runs `bind(plan, values)` (agrpo/launchers/binding.py).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    "PYTHONWARNINGS",
    "AGRPO_TENANT_LEASE_S",
}


PLACEHOLDER = re.compile(r"<(?:port|secret):[A-Za-z0-9_.-]+>")


def port_placeholder(name: str) -> str:
    """How the plan writes the port named `name` (e.g. `--port <port:vllm-0>`) until it is bound."""
    return f"<port:{name}>"


def secret_placeholder(name: str) -> str:
    """How the plan writes the secret named `name` (an env value) until it is bound; the dry run shows this name."""
    return f"<secret:{name}>"


def shown_env_value(name: str, value: str) -> str:
    """An env value as the dry run prints it: safe ones as they are, a secret's placeholder by its name, else hidden."""
    if name in SAFE_ENV_VALUES or (value.startswith("<secret:") and PLACEHOLDER.fullmatch(value)):
        return value
    return "<set>"


def shown_command(argv: list[str]) -> str:
    """`shlex.join(argv)` with each placeholder left bare (`--port <port:vllm-0>`), quoted as the bound command will
    be: a bound value (digits, or a secret's URL-safe characters) needs no quotes, so the printed plan and the one
    that runs differ by the values alone."""
    words = []
    for arg in argv:
        word = shlex.quote(PLACEHOLDER.sub(_STAND_IN, arg))
        for placeholder in PLACEHOLDER.findall(arg):
            word = word.replace(_STAND_IN, placeholder, 1)
        words.append(word)
    return " ".join(words)


_STAND_IN = "agrpo0placeholder"  # what shlex.quote sees instead of a placeholder: characters it leaves unquoted


@dataclass
class ProcessSpec:
    name: str
    role: str  # "replica" | "proxy" | "trainer"
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int | str | None = None  # a number once bound; `<port:NAME>` in a plan as built
    health_url: str | None = None
    log_path: str | None = None
    gpus: list[int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.port, str) and self.port.isdigit():  # bound: the placeholder's text became the number
            self.port = int(self.port)

    def render(self) -> str:
        env = " ".join(f"{k}={shown_env_value(k, v)}" for k, v in sorted(self.env.items()))
        lines = [
            f"[{self.role}] {self.name}"
            + (f"  port={self.port}" if self.port else "")
            + (f"  gpus={self.gpus}" if self.gpus is not None else "")
        ]
        if env:
            lines.append(f"  env: {env}")
        lines.append(f"  cmd: {shown_command(self.argv)}")
        if self.log_path:
            lines.append(f"  log: {self.log_path}")
        return "\n".join(lines)


@dataclass
class ModelStep:
    """Model preparation before any process starts (agrpo/models/resolve.py): build it with `builder`, or check that
    `name_or_path` is there (a local folder, or a Hub id in the cache when offline)."""

    name_or_path: str
    builder: str | None = None
    builder_input: str | None = None  # model.builder_input: what the builder builds from (JSON text)

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
    trainer_during_boot: bool = False  # the trainer starts with the replicas and loads while they boot ...
    trainer_waits_because: str = ""  # ... or, when this says why, once the services are healthy

    def render(self) -> str:
        restarts = (
            f"restart a dead replica up to {self.max_restarts} time(s)" if self.restart_replicas else "no restarts"
        )
        lines = [
            f"[supervision] services healthy within {self.startup_timeout_s:g} s; {restarts}; "
            f"each process group stopped within {self.stop_timeout_s:g} s"
        ]
        if self.trainer_during_boot:
            lines.append("[trainer start] with the replicas: it loads while they boot (TRL waits for /health)")
        elif self.trainer_waits_because:
            lines.append(f"[trainer start] once the services are healthy: {self.trainer_waits_because}")
        return "\n".join(lines)


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
class PortGroup:
    """Ports the executor reserves together when it runs the plan: one per name, in order, each the next port at or
    above `start` on `host` that is free and held by no other agrpo run (agrpo/processes/ports.py). `key` is the
    config key `start` comes from, for the dry run."""

    names: list[str]
    start: int
    host: str = "127.0.0.1"
    key: str = "inference.base_port"

    def render(self) -> str:
        return (
            f"[ports] {', '.join(self.names)}: the first {len(self.names)} free at or above {self.start} ({self.key}) "
            f"on {self.host}, reserved when the run starts and held until it ends"
        )


@dataclass
class Placeholders:
    """What a plan names but does not hold: the run's ports and secrets. They are made when the plan is executed
    (agrpo/launchers/binding.py), so building a plan (the dry run, tests, the in-Job plan a Jobs dry run shows) has no
    side effect and the same spec builds the same plan. In the plan's strings each is `<port:NAME>` or
    `<secret:NAME>`."""

    ports: list[PortGroup] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        ports = [port_placeholder(name) for group in self.ports for name in group.names]
        return ports + [secret_placeholder(name) for name in self.secrets]

    def render(self) -> list[str]:
        lines = [group.render() for group in self.ports]
        if self.secrets:
            lines.append(f"[secrets] {', '.join(self.secrets)}: made fresh when the run starts, never printed")
        return lines


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
    placeholders: Placeholders = field(default_factory=Placeholders)  # made and bound by the executor

    def render(self) -> str:
        parts = [f"agrpo plan ({self.launcher}), run dir {self.run_dir}", f"trainer talks to {self.vllm_url}"]
        parts += [f"note: {note}" for note in self.notes]
        parts.append(
            f"[run dir] refuse an earlier run's outputs unless trainer.resume continues it (resume={self.resume})"
        )
        parts += [self.model.render()] if self.model else []
        parts.append(self.supervision.render())
        parts += self.placeholders.render()
        parts += [f"[file] {self.run_dir}/{name}  ({len(text.encode())} bytes)" for name, text in self.files.items()]
        parts += [spec.render() for spec in [*self.services, self.trainer]]
        parts += [self.fleet.render()] if self.fleet else []
        return "\n".join(parts)


def substitute(item: Any, text: Callable[[str], str]) -> Any:
    """`item` (a plan, or any of its parts) with every string in it passed through `text`: a copy, `item` is left as
    it was. Values that are neither strings, lists, dicts nor dataclasses are kept as they are (e.g. a Hub client)."""
    if isinstance(item, str):
        return text(item)
    if isinstance(item, list):
        return [substitute(value, text) for value in item]
    if isinstance(item, dict):
        return {key: substitute(value, text) for key, value in item.items()}
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        changed = {f.name: substitute(getattr(item, f.name), text) for f in dataclasses.fields(item) if f.init}
        return dataclasses.replace(item, **changed)
    return item


def bind(plan: Plan, values: Mapping[str, str]) -> Plan:
    """The concrete plan an executor runs (pure): each of `plan`'s placeholders replaced by its value in `values`
    (placeholder -> text, e.g. "<port:proxy>" -> "8102"), and none left to make. Raises ValueError naming any
    placeholder without a value; `plan` itself is left as the dry run printed it."""
    missing = [name for name in plan.placeholders.names() if name not in values]
    if missing:
        raise ValueError(f"no value for the plan's placeholder(s) {', '.join(missing)}")
    declared = set(plan.placeholders.names())

    def fill(text: str) -> str:
        return PLACEHOLDER.sub(lambda m: values[m[0]] if m[0] in declared else m[0], text)

    return substitute(dataclasses.replace(plan, placeholders=Placeholders()), fill)
