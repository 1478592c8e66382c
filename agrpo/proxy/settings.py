"""Every knob of the replica proxy, with its default and why, in one plain dataclass.

The CLI builds one flag per field from this class and the Hydra schema embeds it as the
`proxy:` section, so it holds only simple typed fields with defaults (OmegaConf structured
config compatible). The `help` metadata is the one-line "why" shown by `--help`.
"""

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from typing import Optional

# The URL rules live in urls.py; url_host and url_problems are imported from here too.
from agrpo.proxy.urls import BadReplicaUrl, canonical_url, url_host, url_problems  # noqa: F401


# The env var a launcher puts the proxy's admin token in (proxy and trainer only; --admin-token-env names it).
ADMIN_TOKEN_ENV = "AGRPO_PROXY_ADMIN_TOKEN"


def _knob(default, why: str, **kwargs):
    return field(default=default, metadata={"help": why}, **kwargs)


@dataclass(frozen=True)
class ProxySettings:
    """Configuration of one proxy in front of N vLLM replicas."""

    # --- where it listens and what it fronts
    upstreams: list[str] = field(
        default_factory=list,
        metadata={"help": "vLLM replica base URLs; X-Agrpo-Replica indexes this order"},
    )
    host: str = _knob("127.0.0.1", "loopback by default: the proxy adds a bearer token upstream")
    port: int = _knob(8000, "the port the trainer's vllm_server_url points at (0 = any free)")
    token_env: Optional[str] = _knob(
        None, "env var whose value is sent as 'Authorization: Bearer' to every upstream (HF Jobs)"
    )

    # --- routing policy
    block_size: int = _knob(16, "tokens per hashed block; vLLM's default KV-cache block size")
    text_chars_per_token: int = _knob(
        4, "characters per token assumed for text prompts (their block size and load estimate)"
    )
    default_max_tokens: int = _knob(1024, "completion tokens assumed when a request omits max_tokens (load estimate)")
    spill_factor: float = _knob(1.5, "leave the affinity replica only when its work exceeds this x the mean work ...")
    spill_slack_requests: float = _knob(
        8.0, "... plus this many copies of the request's own work (one GRPO group's worth)"
    )
    template_fanout: int = _knob(
        64, "a prompt continued by more distinct prompts than this is a shared template, not affinity"
    )
    lru_size: int = _knob(262144, "routing entries remembered (prompts + continuation anchors); bounds memory")

    # --- robustness
    connect_timeout_s: float = _knob(5.0, "a replica that does not accept a connection by then is down")
    total_timeout_s: float = _knob(900.0, "longest a routed request may take, so a hung replica never hangs the client")
    broadcast_timeout_s: float = _knob(
        600.0, "longest one replica may take to answer a broadcast (load, pause, resume...)"
    )
    load_retry_deadline_s: float = _knob(
        60.0, "how long to retry a replica whose mount does not show the adapter yet (then 504)"
    )
    load_retry_initial_s: float = _knob(0.25, "first wait before retrying an adapter not found yet")
    load_retry_max_s: float = _knob(4.0, "cap of the doubling wait between adapter-load retries")
    health_interval_s: float = _knob(2.0, "how often every replica's /health is probed")
    health_timeout_s: float = _knob(5.0, "a probe slower than this marks the replica unhealthy")
    health_quorum: int = _knob(0, "healthy replicas /health needs for 200; 0 means all of them (no degraded mode)")
    shutdown_timeout_s: float = _knob(5.0, "on stop, in-flight requests get this long to finish")
    max_body_bytes: int = _knob(64 * 1024 * 1024, "larger request bodies get 413")
    log_level: str = _knob("info", "logging level of the agrpo.proxy logger")
    use_uvloop: bool = _knob(True, "run the CLI on uvloop when installed (more requests/s per core)")

    # --- trust (issue 12): who may change state, who gets the upstream token, what memory
    admin_token_env: Optional[str] = _knob(
        None,
        "env var holding the token that replica, adapter, pause/resume and other admin "
        "calls must send as 'Authorization: Bearer' (unset: admin calls are open)",
    )
    token_hosts: str = _knob(
        "*.hf.jobs",
        "comma-separated host patterns (fnmatch) that may receive the --token-env "
        "token besides the hosts of the --upstream URLs given at start",
    )
    max_inflight_body_bytes: int = _knob(
        256 * 1024 * 1024,
        "request bytes held at once over all requests; beyond it new "
        "requests get 503 (bounds memory under many large bodies)",
    )
    token_reserved_body_share: float = _knob(
        0.5,
        "share of --max-inflight-body-bytes that requests without the admin token can never hold, so the run's own "
        "requests (which carry it) never wait behind other clients' bytes (used only with --admin-token-env)",
    )
    max_body_bytes_per_peer: int = _knob(
        64 * 1024 * 1024,
        "request bytes one client address may hold at once without the admin token (at least --max-body-bytes)",
    )
    lean_front: bool = _knob(
        True,
        "serve routed requests with the proxy's own HTTP/1.1 front instead of aiohttp's "
        "server (about half the CPU per request; anything unusual still goes to aiohttp)",
    )
    admit_timeout_s: float = _knob(
        120.0,
        "longest a replica's re-admission (replaying adapters and pause) may take; it "
        "stays out and is retried at the next probe",
    )
    request_read_timeout_s: float = _knob(
        60.0,
        "longest a client may take to send one request's head and body; slower ones get 408 and are "
        "closed, so a client dribbling bytes cannot hold a connection or its body bytes forever",
    )

    # --- tenancy (issue 43): one fleet, many runs
    tenancy: bool = _knob(
        False,
        "serve several runs (tenants) on one fleet: registration at /fleet/tenants, a token and an adapter namespace "
        "per run, leases, a fair share of the replicas and each run's cost (needs --admin-token-env)",
    )
    max_tenants: int = _knob(4, "runs the fleet takes at once (--tenancy); one more is refused at registration (409)")
    max_loras: int = _knob(
        0,
        "LoRA slots the replicas were started with (--max-loras): registration refuses versions beyond (0: unchecked)",
    )
    max_lora_rank: int = _knob(
        0, "the replicas' --max-lora-rank: registration refuses a larger lora_rank (0: unchecked)"
    )
    tenant_slots_per_replica: int = _knob(
        256, "sequences one replica runs at once (its --max-num-seqs): the fair share divides these between tenants"
    )

    def problems(self) -> list[str]:
        """Everything wrong with these settings, as sentences naming the flag to change."""
        found = []
        if not self.upstreams:
            found.append("no replica given: pass --upstream URL at least once")
        for url in self.upstreams:
            found.extend(url_problems(url))
        canonical = [_canonical_or_none(url) for url in self.upstreams]
        valid = [url for url in canonical if url is not None]
        if len(set(valid)) != len(valid):
            found.append("the same replica is given twice as --upstream (URLs that differ only in spelling count)")
        if not 0 <= self.port <= 65535:
            found.append(f"--port {self.port} is not a TCP port (0-65535)")
        for name in (
            "block_size",
            "text_chars_per_token",
            "default_max_tokens",
            "lru_size",
            "template_fanout",
            "max_body_bytes",
            "max_inflight_body_bytes",
        ):
            if getattr(self, name) < 1:
                found.append(f"--{flag_name(name)} must be at least 1")
        for name in (
            "connect_timeout_s",
            "total_timeout_s",
            "broadcast_timeout_s",
            "load_retry_initial_s",
            "load_retry_max_s",
            "health_interval_s",
            "health_timeout_s",
            "shutdown_timeout_s",
            "admit_timeout_s",
            "request_read_timeout_s",
        ):
            if getattr(self, name) <= 0:
                found.append(f"--{flag_name(name)} must be positive")
        if self.max_inflight_body_bytes < self.max_body_bytes:
            found.append(
                "--max-inflight-body-bytes must be at least --max-body-bytes (else the "
                "largest allowed body could never be accepted)"
            )
        if self.max_body_bytes_per_peer < self.max_body_bytes:
            found.append("--max-body-bytes-per-peer must be at least --max-body-bytes")
        if not 0 <= self.token_reserved_body_share < 1:
            found.append("--token-reserved-body-share must be at least 0 and below 1")
        elif self.admin_token_env and self.open_body_bytes() < self.max_body_bytes:
            found.append(
                "--max-inflight-body-bytes x (1 - --token-reserved-body-share) must be at least --max-body-bytes "
                "(else the largest body without the admin token could never be accepted)"
            )
        found.extend(self._tenancy_problems())
        if self.spill_factor < 1:
            found.append("--spill-factor below 1 would spill from a replica under the mean load")
        if self.spill_slack_requests < 0 or self.load_retry_deadline_s < 0 or self.health_quorum < 0:
            found.append("--spill-slack-requests, --load-retry-deadline-s and --health-quorum cannot be negative")
        if self.health_quorum > len(self.upstreams) > 0:
            found.append(f"--health-quorum {self.health_quorum} exceeds the {len(self.upstreams)} replicas given")
        return found

    def _tenancy_problems(self) -> list[str]:
        found = []
        if self.tenancy and not self.admin_token_env:
            found.append("--tenancy needs --admin-token-env (the fleet's admin token registers the runs)")
        if self.max_tenants < 1 or self.tenant_slots_per_replica < 1:
            found.append("--max-tenants and --tenant-slots-per-replica must be at least 1")
        if self.max_loras < 0 or self.max_lora_rank < 0:
            found.append("--max-loras and --max-lora-rank cannot be negative (0: not checked)")
        return found

    def open_body_bytes(self) -> int:
        """Request bytes that requests without the admin token may hold together (all of them without a token)."""
        if not self.admin_token_env:
            return self.max_inflight_body_bytes
        return int(self.max_inflight_body_bytes * (1 - self.token_reserved_body_share))


def _canonical_or_none(url: object) -> str | None:
    try:
        return canonical_url(url)  # type: ignore[arg-type]
    except BadReplicaUrl:
        return None


def token_patterns(settings: "ProxySettings") -> list[str]:
    return [p.strip().lower() for p in settings.token_hosts.split(",") if p.strip()]


def may_receive_token(host: str, start_hosts: set[str], patterns: list[str]) -> bool:
    """Whether the upstream token may be sent to `host`: a start host, or one matching a pattern."""
    host = host.lower()
    return host in start_hosts or any(fnmatchcase(host, p) for p in patterns)


def is_loopback(host: str) -> bool:
    """127.x, ::1 and localhost; anything else (0.0.0.0, a LAN address, a name) is reachable."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def flag_name(field_name: str) -> str:
    """The CLI flag for a settings field (`upstreams` is repeated as `--upstream`)."""
    return "upstream" if field_name == "upstreams" else field_name.replace("_", "-")


def proxy_knob_flags(proxy_cfg: ProxySettings, skip: Sequence[str] = ()) -> list[str]:
    """CLI flags for every proxy knob that differs from its default (upstreams/host/port are set by the launcher
    plan, and so are the knobs named in `skip`)."""
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
