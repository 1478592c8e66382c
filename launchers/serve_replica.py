"""Serve one vLLM replica of an agrpo config on this machine, with the flags `python -m agrpo` derives for it.

    AGRPO_REPLICA_API_KEY=<key> python launchers/serve_replica.py --port 8000 --host <address> +recipe=gsm8k [...]

For replicas agrpo does not start itself (slurm_multi_node.sbatch). Keyed, like every replica agrpo starts: the key
comes from AGRPO_REPLICA_API_KEY (the environment only: a command line is visible to every user of the machine; at
least 32 characters when the replica listens beyond loopback, else it refuses to start, exit 2) and
every request but `GET /health`, `/ping`, `/metrics`, `/version`, `/load` needs it (vLLM checks `/v1/*`,
agrpo's ReplicaGuard the rest, dev endpoints included: TRL needs `/server_info`, `/pause`, `/resume`,
`/get_world_size`, so vLLM's dev mode stays on behind the key). The trainer's proxy sends it with
`proxy.token_env=AGRPO_REPLICA_API_KEY`. Listens on --host (default: the config's inference.host, 127.0.0.1); give
the address the trainer reaches this machine by. `launcher.dry_run=true` among the overrides prints the command
(the key shown as <set>) instead of running it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import socket
import sys

REPLICA_KEY_ENV = "AGRPO_REPLICA_API_KEY"  # = agrpo.inference.replica_guard.REPLICA_KEY_ENV (a test checks)
MIN_EXPOSED_KEY = 32  # characters, for a replica others can reach; token_urlsafe(32) gives 43 (about 256 bits)
SHOWN_ENV = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_SERVER_DEV_MODE", "VLLM_LOGGING_LEVEL", "VLLM_CPU_KVCACHE_SPACE")


def key_problem(key: str) -> str | None:
    """Why the replica cannot start with `key` (None: it can)."""
    if key.strip():
        return None
    return (
        f"no API key: set {REPLICA_KEY_ENV} in this process's environment (e.g. `export {REPLICA_KEY_ENV}=$(python -c "
        "'import secrets; print(secrets.token_urlsafe(32))')`) and give the same variable to the trainer's proxy with "
        f"proxy.token_env={REPLICA_KEY_ENV}; slurm_multi_node.sbatch makes one per job. A replica without a key would "
        "let anyone who reaches its port load adapters, pause it or call /collective_rpc"
    )


def beyond_loopback(host: str, addresses: list[str]) -> bool:
    """Whether a server listening on `host` (resolving to `addresses`) can be reached from other machines: any
    address but loopback (0.0.0.0 and :: included), or a name that resolves to one, or to nothing here."""
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host.lower() in ("localhost", "localhost."):
        return False
    return not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def exposed_key_problem(key: str, host: str, addresses: list[str]) -> str | None:
    """Why `key` is too short for a replica bound beyond loopback (None: long enough, or reachable from this machine
    only): anyone who reaches the port may try keys, and a short one falls to guessing."""
    key = key.strip()
    if len(key) >= MIN_EXPOSED_KEY or not beyond_loopback(host, addresses):
        return None
    return (
        f"{REPLICA_KEY_ENV} is {len(key)} characters, and --host {host} listens beyond this machine: a replica others "
        f"can reach needs a key of at least {MIN_EXPOSED_KEY} characters, since anyone who reaches its port may guess "
        f"a short one and then load adapters, pause it or call /collective_rpc; make one with `export "
        f"{REPLICA_KEY_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')` (43 characters) and give "
        f"the same variable to the trainer's proxy, or listen on 127.0.0.1"
    )


def bind_problem(host: str, addresses: list[str]) -> str | None:
    """Why `host` (resolving to `addresses`) is no address for a replica the trainer reaches from elsewhere: a name
    that resolves to loopback on this machine (Debian's 127.0.1.1 for the hostname) would bind where nobody else
    can connect, and the trainer would wait for it forever. A loopback host asked for as such is fine."""
    try:
        if ipaddress.ip_address(host.strip("[]")).is_loopback:
            return None
    except ValueError:
        pass
    if host.lower() in ("localhost", "localhost.") or not addresses:
        return None
    if all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        return (
            f"--host {host} resolves to {', '.join(sorted(set(addresses)))} on this machine (loopback): the trainer on "
            "another node could not reach the replica; give this node's address on the cluster network instead "
            "(AGRPO_REPLICA_HOST for slurm_multi_node.sbatch)"
        )
    return None


def resolve(host: str) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
    except (OSError, UnicodeError):
        return []


def shown(env: dict[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v) if k in SHOWN_ENV else '<set>'}" for k, v in sorted(env.items()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default=None, help="the address to listen on (default: inference.host)")
    args, overrides = parser.parse_known_args(argv)
    from agrpo.config.prepare import prepare_overrides
    from agrpo.config.spec import with_values
    from agrpo.errors import AgrpoError
    from agrpo.inference.vllm_server import build_replica_launch

    try:
        # The run's validation and resolution (agrpo/config/prepare.py); a replica node needs none of the trainer's
        # data, rewards or packages, so the checks against this machine are the trainer's to run.
        cfg = prepare_overrides(overrides, output_dir=os.getcwd(), check_environment=False)
    except AgrpoError as error:
        print(f"serve_replica: error: {error}", file=sys.stderr)
        return error.exit_code
    host = args.host or cfg.inference.host
    key, addresses = os.environ.get(REPLICA_KEY_ENV, ""), resolve(host)
    problem = key_problem(key) or bind_problem(host, addresses) or exposed_key_problem(key, host, addresses)
    if problem:
        print(f"serve_replica: error: {problem}.", file=sys.stderr)
        return 2
    cfg = with_values(cfg, {"inference.host": host})  # the address the trainer reaches this node by
    key = os.environ[REPLICA_KEY_ENV].strip()
    launch = build_replica_launch(cfg, args.port, cfg.inference.device, None, sys.executable, api_key=key)
    if cfg.launcher.dry_run:
        print(f"replica on {os.uname().nodename}: {shown(launch.env)} {shlex.join(launch.argv)}")
        return 0
    from agrpo.models.resolve import prepare_model

    prepare_model(cfg.model)
    os.execvpe(launch.argv[0], launch.argv, {**os.environ, **launch.env})
    return 1  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
