"""Checks for launcher=hf_jobs and sync=bucket that run before any Job, bucket or file exists (pure).

`hf_jobs_problems(cfg)` returns one sentence per problem, each naming the key to change; the validation pass refuses
the config while any remains, so the planner builds from a spec that has none. It covers what would make the Jobs fail on first use: what the Jobs API or `HfApi.run_job`
refuses (a flavor that is not one of huggingface_hub's hardware names, a label named `name` or one agrpo sets, names
outside the Hub's tag alphabet, a timeout below one second), a secret that would be resolved into the Job's config,
a replica asked to serve on the wrong device for its flavor. (A model or data file only this machine has is not a
problem: the planner uploads it to the bucket for the Jobs, launchers/hf_jobs/inputs.py.)
"""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agrpo.config.schema import TrainerLauncher

JOB_NAME = re.compile(r"[A-Za-z0-9_-]+")  # what the Hub accepts in Job names and label keys/values
# Label keys the launcher sets on every Job: `name` (run_job stores the Job's name there and refuses both at once) and
# agrpo's own, by which the trainer Job and `agrpo jobs` find a run's Jobs.
RESERVED_LABELS = ("name", "agrpo-run", "agrpo-role", "agrpo-launch")
ENV_INTERPOLATION = re.compile(r"\$\{(?:oc\.env|env):\s*([A-Za-z_][A-Za-z0-9_]*)")
SECRET_LIKE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL|PRIVATE_KEY", re.IGNORECASE)


def walk(node: Any, prefix: str = ""):
    """(dotted key, value) of every leaf of a plain container."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{prefix}[{index}]")
    else:
        yield prefix, node


def interpolated_secrets(cfg: DictConfig, secret_names: list[str]) -> list[tuple[str, str]]:
    """(key, env name) of every `${oc.env:NAME}` reading a secret: a name in launcher.hf_jobs.secrets or one that
    looks like a credential. Resolving it would write its value into the Job's config file."""
    raw = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    found = []
    for key, value in walk(raw):
        if isinstance(value, str):
            for name in ENV_INTERPOLATION.findall(value):
                if name in secret_names or SECRET_LIKE.search(name):
                    found.append((key, name))
    return found


def under_mount(path: str, mount_path: str) -> bool:
    """Whether `path` lies inside the bucket mount (so every Job sees it there)."""
    return os.path.abspath(path).startswith(os.path.abspath(mount_path).rstrip("/") + "/")


def bucket_problems(sync: Any) -> list[str]:
    problems = []
    if not os.path.isabs(sync.mount_path):
        problems.append(f"sync.mount_path={sync.mount_path!r} must be an absolute path")
    elif not under_mount(sync.output_dir, sync.mount_path):
        problems.append(
            f"sync.output_dir={sync.output_dir!r} is not under sync.mount_path={sync.mount_path!r}: "
            "adapters written there would never reach the bucket"
        )
    if not re.fullmatch(r"([\w.-]+/)?[\w.-]+", sync.bucket or ""):
        problems.append(f"sync.bucket={sync.bucket!r} must be 'name' or 'namespace/name'")
    return problems


def name_problems(jobs: Any) -> list[str]:
    problems = []
    if not JOB_NAME.fullmatch(str(jobs.run_id)):
        problems.append(
            f"launcher.hf_jobs.run_id={jobs.run_id!r} may hold only letters, digits, '_' and '-' (it "
            "names the Jobs, labels them and names the bucket folder; the Hub refuses other characters)"
        )
    for key, value in (jobs.labels or {}).items():
        if not (JOB_NAME.fullmatch(str(key)) and JOB_NAME.fullmatch(str(value))):
            problems.append(
                f"launcher.hf_jobs.labels.{key}={value!r}: label keys and values may hold only letters, "
                "digits, '_' and '-'"
            )
        if str(key) in RESERVED_LABELS:
            why = "HfApi.run_job stores the Job's name there" if key == "name" else "the run's Jobs are found by it"
            problems.append(
                f"launcher.hf_jobs.labels.{key}: agrpo sets the {key!r} label on every Job itself ({why}): "
                "choose another label key"
            )
    return problems


def job_flavors() -> list[str]:
    """The hardware names of huggingface_hub (its JobHardware enum, which it keeps in sync with the Jobs API)."""
    from huggingface_hub import JobHardware

    return [flavor.value for flavor in JobHardware]


def is_cpu_flavor(flavor: str) -> bool:
    return str(flavor).startswith("cpu-")


def flavor_problems(jobs: Any) -> list[str]:
    """Flavors the Jobs API refuses, and timeouts it would not take."""
    problems = []
    known = job_flavors()
    for key in ("replica_flavor", "trainer_flavor"):
        if jobs[key] not in known:
            problems.append(
                f"launcher.hf_jobs.{key}={jobs[key]!r} is not a Jobs flavor: choose one of {', '.join(known)} "
                "(`hf jobs hardware` lists them with prices; a flavor newer than this huggingface_hub needs an "
                "upgrade of huggingface_hub)"
            )
    for key in ("replica_timeout_s", "trainer_timeout_s"):
        if jobs[key] < 1:
            problems.append(f"launcher.hf_jobs.{key}={jobs[key]} must be >= 1 (seconds before the platform stops it)")
    return problems


def device_problems(cfg: DictConfig, jobs_on_this_machine: bool) -> list[str]:
    """The replicas' device must match their flavor (Jobs that run on this machine serve on it, whatever the
    flavor)."""
    jobs, device = cfg.launcher.hf_jobs, cfg.inference.device
    if jobs_on_this_machine:
        return []
    if is_cpu_flavor(jobs.replica_flavor) and device != "cpu":
        return [
            f"launcher.hf_jobs.replica_flavor={jobs.replica_flavor} has no GPU: set inference.device=cpu (the "
            "replicas then get vLLM's CPU flags) and launcher.hf_jobs.replica_image to a CPU build of vLLM"
        ]
    if device == "cpu" and not is_cpu_flavor(jobs.replica_flavor):
        return [
            "launcher=hf_jobs runs vLLM's GPU image: set inference.device=auto or cuda (or a CPU "
            "launcher.hf_jobs.replica_flavor such as cpu-upgrade, with a CPU build of vLLM as replica_image)"
        ]
    return []


def install_problems(jobs: Any) -> list[str]:
    problems = []
    if jobs.trainer_image_has_agrpo and jobs.install:
        problems.append(
            f"launcher.hf_jobs.install={jobs.install!r} and launcher.hf_jobs.trainer_image_has_agrpo=true "
            "contradict each other: keep one (the image's agrpo, or a pinned requirement to install)"
        )
    if jobs.install and re.fullmatch(r"[A-Za-z0-9_.-]+", jobs.install.strip()):
        problems.append(
            f"launcher.hf_jobs.install={jobs.install!r} is a bare package name, which would install "
            "whatever an index serves under that name inside a Job holding your token: pin it "
            "('agrpo==X.Y.Z' or 'agrpo @ https://.../agrpo-X.Y.Z-py3-none-any.whl') or leave it empty "
            "to install the wheel agrpo builds from this machine's code"
        )
    if jobs.install_attempts < 1:
        problems.append("launcher.hf_jobs.install_attempts must be >= 1")
    return problems


def hf_jobs_problems(cfg: DictConfig, jobs_on_this_machine: bool = False) -> list[str]:
    """Every problem of a launcher=hf_jobs / sync=bucket config; [] when it can launch (the planner trusts the spec
    for all of it). `jobs_on_this_machine`: the Hub backend runs the Jobs here (agrpo/launchers/hf_jobs/hub.py), which cannot
    outlive the launch."""
    problems: list[str] = []
    sync = cfg.sync
    if sync.kind == "bucket":
        problems += bucket_problems(sync)
    if cfg.launcher.name != "hf_jobs":
        return problems
    jobs = cfg.launcher.hf_jobs
    if sync.kind != "bucket":
        problems.append(f"launcher=hf_jobs needs sync=bucket (sync.kind={sync.kind!r}): Jobs share no disk")
    if cfg.role == "all":  # the launching machine plans the replica Jobs; inside the trainer Job they exist already
        problems += device_problems(cfg, jobs_on_this_machine)
    problems += flavor_problems(jobs)
    if jobs_on_this_machine and jobs.detach:
        problems.append(
            "launcher.hf_jobs.detach=true with Jobs on this machine: their stand-in Hub stops, with every Job, "
            "when the launch returns, so a detached run would end at once; run it without detach"
        )
    problems += name_problems(jobs)
    problems += install_problems(jobs)
    if TrainerLauncher.parse(jobs.trainer_launcher) is None:
        problems.append(
            f"launcher.hf_jobs.trainer_launcher={jobs.trainer_launcher!r} must be {' or '.join(TrainerLauncher.values())}"
        )
    if jobs.trainer_attempts < 1:
        problems.append("launcher.hf_jobs.trainer_attempts must be >= 1")
    if not 0 < jobs.replica_port < 65536:
        problems.append(f"launcher.hf_jobs.replica_port={jobs.replica_port} is not a TCP port")
    for key, name in interpolated_secrets(cfg, list(jobs.secrets)):
        problems.append(
            f"{key} reads the secret {name} through ${{oc.env:{name}}}, which would write its value "
            f"into the trainer Job's config file on the bucket: add {name} to launcher.hf_jobs.secrets "
            "(every Job then gets it as an environment variable, never in a command or file) and "
            f"remove the interpolation (e.g. proxy.token_env={name} for the proxy's upstream token)"
        )
    if cfg.role == "trainer" and not (jobs.namespace and cfg.inference.use_proxy and cfg.proxy.token_env):
        problems.append(
            "role=trainer with launcher=hf_jobs runs inside the trainer Job and needs "
            "launcher.hf_jobs.namespace, inference.use_proxy=true and proxy.token_env (the replicas' URLs "
            "need the HF token): the launcher sets all three"
        )
    return problems
