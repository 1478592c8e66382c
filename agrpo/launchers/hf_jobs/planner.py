"""Config -> JobsPlan (pure apart from locating the local package and local inputs): R vLLM replica Jobs and one
trainer Job.

A model folder, data file or chat template on this machine is uploaded into the run's folder and the Jobs read it
there (inputs.py). The replicas run the command the local launcher derives from the config (same flags) through
the image's `vllm serve`, listening on 0.0.0.0 and exposed as https://<job_id>--<port>.hf.jobs. The trainer Job
installs the wheel of the launching code from the bucket (or a pinned requirement, or nothing when its image has
agrpo) without touching the image's vLLM/torch/transformers, then runs `python -m agrpo.launchers.hf_jobs.trainer
CONFIG`: the run config resolved here, never re-composed from command-line overrides. Inside, it finds the replicas
of its launch by label, starts agrpo's proxy (which adds the HF token upstream) and the trainer, and cancels the
replicas at the end.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from typing import Any

from omegaconf import OmegaConf

from agrpo.config.hf_jobs_checks import walk
from agrpo.config.schema import HFJobsConfig, RunConfig
from agrpo.config.spec import config_of_text, spec_of, spec_yaml, with_values
from agrpo.errors import ConfigError
from agrpo.inference.vllm_server import build_replica_launch
from agrpo.launchers.hf_jobs.after import after_run, cpu_flavor_note, launch_context, launch_record
from agrpo.config.schema.inference import fleet_bounds, is_auto_fleet
from agrpo.launchers.hf_jobs.fleet import jobs_fleet, run_estimate
from agrpo.launchers.hf_jobs.hub import HubBackend, RealHub
from agrpo.launchers.hf_jobs.inputs import config_for_jobs, local_inputs
from agrpo.launchers.hf_jobs.package import package_root, wheel_filename
from agrpo.launchers.hf_jobs.plan import (
    LAUNCH_ID_ENV,
    LAUNCH_LABEL,
    NAMESPACE_PLACEHOLDER,
    ROLE_LABEL,
    RUN_LABEL,
    TOKEN_SECRET,
    ConfigUpload,
    JobSpec,
    JobsPlan,
    Watch,
    WheelBuild,
)
from agrpo.launchers.hf_jobs.repack import installed_distribution, site_dir, wheel_name
from agrpo.sync.bucket import bucket_id, path_in_bucket

CONFIG_FILE = "config.yaml"
WHEEL_DIR = ".agrpo"
# TRL's packed attention on GPU loads its kernel through `kernels`; TRL's extra picks the `kernels` version that the
# image's (constrained) transformers accepts.
GPU_EXTRAS = "trl[kernels]==1.16.*"
# Installs agrpo without moving the image's vLLM/torch/transformers (pinned to what the image has), retrying the
# dependency download; then execs the trainer. Arguments: the requirements, `--`, the trainer's command. pip's own
# output goes to a file, copied to <run dir>/logs/install.log when the run's folder is mounted: the Job's log (and the
# launching terminal) gets pip's last line, or its last 20 lines when it fails.
INSTALL_SCRIPT = (
    'set -u; reqs=(); while [ "$1" != "--" ]; do reqs+=("$1"); shift; done; shift; '
    'pins=$(mktemp); out=$(mktemp); keep() {{ if [ -d {run_dir} ]; then mkdir -p {run_dir}/logs && cp "$out" {log}; fi; }}; '
    '"$1" -m pip freeze 2>/dev/null | grep -iE "^(vllm|torch|transformers)==" > "$pins"; '
    "for attempt in $(seq {attempts}); do "
    'if "$1" -m pip install --no-cache-dir --constraint "$pins" "${{reqs[@]}}" >> "$out" 2>&1; then keep; '
    'grep -E "^Successfully installed" "$out" | tail -n 1; echo "agrpo: pip\'s log: {log}"; exec "$@"; fi; '
    'keep; tail -n 20 "$out" >&2; echo "agrpo: pip install failed (attempt $attempt of {attempts})" >&2; '
    'if [ "$attempt" -lt {attempts} ]; then sleep $((attempt * 15)); fi; done; exit 1'
)
INSTALL_LOG = "logs/install.log"
REAL_HUB = RealHub()  # the backend of a plan built without one: the Hub


def job_labels(cfg: RunConfig, run_id: str, launch_id: str, role: str) -> dict[str, str]:
    return {
        **{str(k): str(v) for k, v in cfg.launcher.hf_jobs.labels.items()},
        RUN_LABEL: run_id,
        ROLE_LABEL: role,
        LAUNCH_LABEL: launch_id,
    }


def bucket_volume(cfg: RunConfig, bucket: str, read_only: bool) -> dict[str, Any]:
    return {"source": bucket, "mount_path": cfg.sync.mount_path, "read_only": read_only}


def vllm_serve_argv(argv: list[str]) -> list[str]:
    """`<python> -m <server module> --model M ...` as `vllm serve M ...` (vllm serve wants the model positional)."""
    rest = list(argv[3:])
    at = rest.index("--model")
    model = rest[at + 1]
    del rest[at : at + 2]
    return ["vllm", "serve", model, *rest]


def replica_url_pattern(cfg: RunConfig, hub: HubBackend = REAL_HUB) -> str:
    return hub.replica_url(str(cfg.launcher.hf_jobs.replica_url))


def replica_job(
    cfg: RunConfig, index: int, bucket: str, run_id: str, launch_id: str, hub: HubBackend = REAL_HUB
) -> JobSpec:
    """Replica Job `index`: the local launcher's replica command, on the resolved inference.device (prepare decided it
    once: cuda for Jobs, cpu where a CPU flavor asks for it, this machine's for Jobs that run here)."""
    jobs = cfg.launcher.hf_jobs
    served = with_values(cfg, {"inference.host": "0.0.0.0"})  # reachable through the Jobs proxy, not only inside
    launch = build_replica_launch(served, jobs.replica_port, str(cfg.inference.device), None, jobs.python)
    return JobSpec(
        name=f"{run_id}-vllm-{index}",
        role="replica",
        image=jobs.replica_image,
        flavor=jobs.replica_flavor,
        command=vllm_serve_argv(launch.argv) if jobs.replica_vllm_serve else launch.argv,
        env=dict(launch.env),
        secrets=list(jobs.secrets),
        volumes=[bucket_volume(cfg, bucket, read_only=True)],
        labels=job_labels(cfg, run_id, launch_id, "replica"),
        timeout_s=int(jobs.replica_timeout_s),
        expose=[jobs.replica_port],
        url=replica_url_pattern(cfg, hub).format(job_id=f"<vllm-{index}-job-id>", port=jobs.replica_port),
    )


def trainer_requirements(jobs: HFJobsConfig, wheel_path: str | None, cpu_here: bool = False) -> list[str]:
    """What pip installs in the trainer Job: nothing (the image has agrpo), a pinned requirement, or the wheel;
    plus TRL's GPU kernels on GPU flavors (not for Jobs on this machine serving on its CPU: no GPU, no index to fetch
    them from)."""
    if jobs.trainer_image_has_agrpo:
        return []
    requirements = [jobs.install] if jobs.install else [wheel_path]
    if not str(jobs.trainer_flavor).startswith("cpu") and not cpu_here:
        requirements.append(GPU_EXTRAS)
    return requirements


def trainer_job(
    cfg: RunConfig,
    bucket: str,
    run_id: str,
    launch_id: str,
    config_path: str,
    wheel_path: str | None,
    hub: HubBackend = REAL_HUB,
) -> JobSpec:
    jobs = cfg.launcher.hf_jobs
    run = [jobs.python, "-m", "agrpo.launchers.hf_jobs.trainer", config_path]
    here = hub.jobs_on_this_machine
    requirements = trainer_requirements(jobs, wheel_path, cpu_here=here and cfg.inference.device == "cpu")
    # Requirements and command travel as bash's positional arguments, so nothing is ever re-quoted for a shell.
    run_dir = str(cfg.sync.output_dir)
    script = INSTALL_SCRIPT.format(
        attempts=int(jobs.install_attempts), run_dir=shlex.quote(run_dir), log=shlex.quote(f"{run_dir}/{INSTALL_LOG}")
    )
    command = (
        [
            "bash",
            "-c",
            script,
            "agrpo-install",
            *requirements,
            "--",
            *run,
        ]
        if requirements
        else run
    )
    return JobSpec(
        name=f"{run_id}-trainer",
        role="trainer",
        image=jobs.trainer_image,
        flavor=jobs.trainer_flavor,
        command=command,
        env={LAUNCH_ID_ENV: launch_id},
        secrets=list(dict.fromkeys([TOKEN_SECRET, *jobs.secrets])),
        volumes=[bucket_volume(cfg, bucket, read_only=False)],
        labels=job_labels(cfg, run_id, launch_id, "trainer"),
        timeout_s=int(jobs.trainer_timeout_s),
        attempts=int(jobs.trainer_attempts),
    )


def in_job_processes(config_text: str, replicas: int) -> list[Any]:
    """The proxy and trainer the trainer Job will start: the local plan (role=trainer) of the config it is handed,
    against the replica Jobs' URL pattern, its port and secrets by name (the Job makes them when it runs the plan). Under launcher.hf_jobs.trainer_launcher=accelerate the trainer's command
    becomes `accelerate launch` with one rank per GPU of the flavor (agrpo/launchers/accelerate.py)."""
    from agrpo.launchers.local import build_local_plan

    job = spec_of(config_of_text(config_text))
    jobs = job.launcher.hf_jobs
    urls = [jobs.replica_url.format(job_id=f"<vllm-{i}-job-id>", port=jobs.replica_port) for i in range(replicas)]
    job = with_values(job, {"inference.urls": urls})
    plan = build_local_plan(job, str(job.sync.output_dir), str(job.inference.device), 0, [0], python=jobs.python)
    if jobs.trainer_launcher == "accelerate":
        plan.trainer.name = "trainer (under `accelerate launch`, one rank per GPU of the flavor)"
    return [*plan.services, plan.trainer]


def job_config_text(cfg: RunConfig, namespace: str, bucket: str, hub: HubBackend = REAL_HUB) -> str:
    """The resolved config the trainer Job runs from: the launching spec with the trainer Job's own role."""
    job = with_values(
        cfg,
        {
            "role": "trainer",
            "inference.use_proxy": True,  # the proxy adds the HF token the replicas' URLs require
            "inference.urls": [],  # filled inside the Job with its replicas' URLs, found by the launch label
            "proxy.token_env": TOKEN_SECRET,
            "sync.bucket": bucket,
            "launcher.dry_run": False,
            "launcher.hf_jobs.namespace": namespace,
            "launcher.hf_jobs.replica_url": replica_url_pattern(cfg, hub),  # how the trainer Job reaches its replicas
        },
    )
    return spec_yaml(job)


def refuse_secret_values(text: str, secrets: list[str]) -> None:
    """A secret's value written literally into the config (e.g. proxy.token=hf_...) would land on the bucket."""
    values = {name: os.environ.get(name) for name in secrets}
    leaked = sorted(name for name, value in values.items() if value and len(value) >= 8 and value in text)
    if leaked:
        keys = sorted(
            {
                key
                for key, value in walk(OmegaConf.to_container(OmegaConf.create(text)))
                if isinstance(value, str) and any(values[n] in value for n in leaked)
            }
        )
        raise ConfigError(
            f"the value of the secret(s) {leaked} is written in the config at {keys}: it would reach "
            "the bucket and the Jobs' metadata. Remove it and name the secret in "
            "launcher.hf_jobs.secrets (the Jobs get it as an environment variable)"
        )


def local_wheel(folder_in_bucket: str) -> WheelBuild:
    """The wheel of the agrpo running here: built from its source tree, or packed from its installed files."""
    root = package_root()
    if root is not None:
        filename = wheel_filename(root)
        return WheelBuild(str(root), filename, f"{folder_in_bucket}/{filename}", sys.executable)
    dist = installed_distribution()
    if dist is None:
        raise ConfigError(
            "the agrpo running here has neither a source tree (pyproject.toml beside the package) nor "
            "an installed file list, so the trainer Job's wheel cannot be made: set "
            "launcher.hf_jobs.install to a pinned requirement (e.g. 'agrpo @ "
            "https://.../agrpo-X.Y.Z-py3-none-any.whl') or launcher.hf_jobs.trainer_image to an image "
            "with agrpo (launchers/Dockerfile) plus launcher.hf_jobs.trainer_image_has_agrpo=true"
        )
    filename = wheel_name(dist)
    return WheelBuild(site_dir(dist), filename, f"{folder_in_bucket}/{filename}", sys.executable, from_installed=True)


def watch_settings(cfg: RunConfig, hub: HubBackend = REAL_HUB) -> Watch:
    jobs = cfg.launcher.hf_jobs
    return Watch(
        replica_url=replica_url_pattern(cfg, hub),
        replica_port=int(jobs.replica_port),
        ready_timeout_s=float(jobs.ready_timeout_s),
        poll_interval_s=float(jobs.poll_interval_s),
        trainer_attempts=int(jobs.trainer_attempts),
        requeue_grace_s=float(jobs.requeue_grace_s),
        detach=bool(jobs.detach),
    )


def plan_notes(launch_id: str, namespace: str, cpu_note: str | None) -> list[str]:
    notes = [
        f"the trainer Job finds the replica Jobs labelled {LAUNCH_LABEL}={launch_id}, runs agrpo's proxy on "
        f"127.0.0.1 in front of their URLs (adding the {TOKEN_SECRET} secret as a bearer token) and cancels them "
        "when it ends"
    ]
    if cpu_note:
        notes.append(cpu_note)
    if namespace == NAMESPACE_PLACEHOLDER:
        notes.append(
            f"{NAMESPACE_PLACEHOLDER} is the token's user, looked up at launch (or set "
            "launcher.hf_jobs.namespace); nothing else in this plan changes"
        )
    return notes


def build_jobs_plan(cfg: RunConfig, launch_id: str | None = None, hub: HubBackend = REAL_HUB) -> JobsPlan:
    """The whole launch as data, from the prepared spec (the validation pass ran the Jobs checks), for the Hub backend
    `hub`. Without launcher.hf_jobs.namespace, `<namespace>` stands for the token's user."""
    jobs = cfg.launcher.hf_jobs
    run_id, launch_id = str(jobs.run_id), launch_id or uuid.uuid4().hex[:12]
    namespace = jobs.namespace or NAMESPACE_PLACEHOLDER
    bucket = bucket_id(cfg.sync, namespace)
    run_dir = str(cfg.sync.output_dir)
    run_dir_in_bucket = path_in_bucket(run_dir, cfg.sync.mount_path)
    wheel = None
    if not jobs.install and not jobs.trainer_image_has_agrpo:
        wheel = local_wheel(f"{run_dir_in_bucket}/{WHEEL_DIR}")
    inputs = local_inputs(cfg, run_dir, run_dir_in_bucket)
    local_dir, overrides = launch_context()
    after = after_run(cfg, run_id, inputs, local_dir, overrides)
    fewest, most = fleet_bounds(cfg.inference)  # a fixed number twice, or min_replicas..max_replicas with auto
    cpu_note = cpu_flavor_note(cfg, [str(jobs.replica_flavor)] * fewest + [str(jobs.trainer_flavor)])
    cfg = config_for_jobs(cfg, inputs)  # from here on, the Jobs' view: local inputs replaced by their bucket copies
    config_text = job_config_text(cfg, namespace, bucket, hub)
    secrets = list(dict.fromkeys([TOKEN_SECRET, *jobs.secrets]))
    record = launch_record(run_dir_in_bucket, overrides)
    for text in (config_text, record.text if record else ""):
        refuse_secret_values(text, secrets)
    config = ConfigUpload(f"{run_dir_in_bucket}/{CONFIG_FILE}", config_text)
    replicas = [replica_job(cfg, i, bucket, run_id, launch_id, hub) for i in range(fewest)]
    fleet = None
    if is_auto_fleet(cfg.inference):
        template = replica_job(cfg, fewest, bucket, run_id, launch_id, hub)
        fleet = jobs_fleet(cfg, template, run_id, run_dir, run_dir_in_bucket)
    trainer = trainer_job(
        cfg,
        bucket,
        run_id,
        launch_id,
        f"{run_dir}/{CONFIG_FILE}",
        f"{run_dir}/{WHEEL_DIR}/{wheel.filename}" if wheel else None,
        hub,
    )
    return JobsPlan(
        run_id=run_id,
        launch_id=launch_id,
        namespace=namespace,
        bucket=bucket,
        run_dir=run_dir,
        replicas=replicas,
        trainer=trainer,
        config=config,
        watch=watch_settings(cfg, hub),
        wheel=wheel,
        inputs=inputs,
        notes=plan_notes(launch_id, namespace, cpu_note),
        hub_lines=hub.plan_lines(),
        jobs_on_this_machine=hub.jobs_on_this_machine,
        launch_record=record,
        after=after,
        in_job=in_job_processes(config_text, fewest),
        fleet=fleet,
        estimate=run_estimate(cfg, fewest, most),
    )
