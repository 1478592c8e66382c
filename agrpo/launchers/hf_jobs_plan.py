"""The HF Jobs plan (pure): R vLLM replica Jobs and one trainer Job, as plain data, with an estimated cost.

The replicas run the command the local launcher derives from the config (same flags), listening on 0.0.0.0 and
exposed as https://<job_id>--<port>.hf.jobs. The trainer Job runs the same `python -m agrpo ...` command the user
typed, plus `role=trainer` and the replicas' URLs: inside it, launcher=hf_jobs starts agrpo's proxy (which adds the
HF token upstream) and the trainer, and cancels the replicas when it ends. Secrets appear here by name only; their
values are attached when a Job is created, never put in a command, a plan or a log.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from agrpo.inference.vllm_server import build_replica_launch
from agrpo.launchers.plan import SAFE_ENV_VALUES
from agrpo.sync.bucket import bucket_id

# Estimated USD per hour by flavor, from Hugging Face's public Jobs pricing when this was written. An estimate
# only: `HfApi().list_jobs_hardware()` returns the current prices.
PRICE_PER_HOUR_USD = {
    "cpu-basic": 0.01, "cpu-upgrade": 0.03,
    "t4-small": 0.40, "t4-medium": 0.60, "l4x1": 0.80, "l4x4": 3.80,
    "l40sx1": 1.80, "l40sx4": 8.30, "l40sx8": 23.50,
    "a10g-small": 1.00, "a10g-large": 1.50, "a10g-largex2": 3.00, "a10g-largex4": 5.00,
    "a100-large": 2.50, "a100x4": 10.00, "a100x8": 20.00,
    "h200": 5.00, "h200x2": 10.00, "h200x4": 20.00, "h200x8": 40.00,
}
RUN_LABEL, ROLE_LABEL = "agrpo-run", "agrpo-role"
TOKEN_SECRET = "HF_TOKEN"  # the secret the proxy sends upstream and the trainer Job cancels replicas with
LAUNCH_ID_ENV = "AGRPO_LAUNCH_ID"  # tells the attempts of one trainer Job apart from a later relaunch
NAMESPACE_PLACEHOLDER = "<namespace>"
# Keys the trainer Job sets itself; the user's values for them are dropped from its command.
TRAINER_OWNED_KEYS = ("role", "inference.urls", "inference.use_proxy", "proxy.token_env", "sync.bucket",
                      "sync.output_dir", "launcher.dry_run", "launcher.hf_jobs.run_id", "launcher.hf_jobs.namespace",
                      "launcher.hf_jobs.detach")


@dataclass
class JobSpec:
    """One Job as data: what `HfApi.run_job` receives, minus secret values."""

    name: str
    role: str  # "replica" | "trainer"
    image: str
    flavor: str
    command: list[str]
    env: dict[str, str]
    secrets: list[str]  # names; values come from the launching machine at creation time
    volumes: list[dict[str, Any]]  # {"source": "ns/bucket", "mount_path": "/bucket", "read_only": bool}
    labels: dict[str, str]
    timeout_s: int
    expose: list[int] = field(default_factory=list)
    attempts: int = 1
    url: str | None = None  # replicas: the exposed base URL (a placeholder until the Job exists)

    def run_job_kwargs(self, namespace: str, secret_values: dict[str, str]) -> dict[str, Any]:
        """Keyword arguments for `HfApi.run_job`."""
        from huggingface_hub import Volume

        volumes = [Volume(type="bucket", source=v["source"], mount_path=v["mount_path"], read_only=v["read_only"])
                   for v in self.volumes]
        return dict(image=self.image, command=list(self.command), env=dict(self.env),
                    secrets={name: secret_values[name] for name in self.secrets} or None, flavor=self.flavor,
                    timeout=self.timeout_s, attempts=self.attempts if self.attempts > 1 else None, name=self.name,
                    labels=dict(self.labels), volumes=volumes or None, expose=list(self.expose) or None,
                    namespace=namespace)

    def render(self) -> str:
        safe = SAFE_ENV_VALUES | {LAUNCH_ID_ENV}
        env = " ".join(f"{k}={v if k in safe else '<set>'}" for k, v in sorted(self.env.items()))
        price = PRICE_PER_HOUR_USD.get(self.flavor)
        lines = [f"[{self.role}] {self.name}",
                 f"  image: {self.image}  flavor: {self.flavor} (~${price:.2f}/h)" if price is not None
                 else f"  image: {self.image}  flavor: {self.flavor} (price unknown)",
                 f"  timeout: {self.timeout_s} s" + (f"  attempts: {self.attempts}" if self.attempts > 1 else ""),
                 f"  cmd: {shlex.join(self.command)}"]
        if env:
            lines.append(f"  env: {env}")
        if self.secrets:
            lines.append(f"  secrets: {' '.join(self.secrets)} (values never shown)")
        for v in self.volumes:
            lines.append(f"  volume: bucket {v['source']} -> {v['mount_path']} ({'read-only' if v['read_only'] else 'read-write'})")
        if self.expose:
            lines.append(f"  ports: {', '.join(map(str, self.expose))} -> {self.url}")
        lines.append(f"  labels: {' '.join(f'{k}={v}' for k, v in sorted(self.labels.items()))}")
        return "\n".join(lines)


@dataclass
class JobsPlan:
    run_id: str
    namespace: str
    bucket: str
    run_dir: str  # sync.output_dir: the run's folder on the bucket mount
    replicas: list[JobSpec]
    trainer: JobSpec
    launcher: str = "hf_jobs"
    notes: list[str] = field(default_factory=list)

    def cost_per_hour(self) -> tuple[float, list[str]]:
        """(estimated USD per hour of every Job together, flavors missing from the price table)."""
        flavors = [job.flavor for job in [*self.replicas, self.trainer]]
        return (sum(PRICE_PER_HOUR_USD.get(f, 0.0) for f in flavors),
                sorted({f for f in flavors if f not in PRICE_PER_HOUR_USD}))

    def render(self) -> str:
        total, unknown = self.cost_per_hour()
        cost = f"estimated cost: ${total:.2f}/hour for {len(self.replicas)} replica Job(s) + 1 trainer Job"
        cost += f" (no price known for {unknown})" if unknown else ""
        parts = [f"agrpo plan (hf_jobs), run id {self.run_id}, namespace {self.namespace}",
                 f"bucket {self.bucket}; run dir {self.run_dir} (adapters, checkpoints, TensorBoard, final adapter)",
                 f"{cost} (an estimate from agrpo's price table; HfApi().list_jobs_hardware() has current prices)"]
        parts += [f"note: {note}" for note in self.notes]
        parts += [job.render() for job in [*self.replicas, self.trainer]]
        return "\n".join(parts)


def safe_label(value: str) -> str:
    """A label/name value the Jobs API accepts."""
    return re.sub(r"[^a-zA-Z0-9._-]", "-", value)


def job_labels(cfg: Any, run_id: str, role: str) -> dict[str, str]:
    return {**{str(k): str(v) for k, v in cfg.launcher.hf_jobs.labels.items()},
            RUN_LABEL: safe_label(run_id), ROLE_LABEL: role}


def replica_url(cfg: Any, job_id: str) -> str:
    jobs = cfg.launcher.hf_jobs
    return jobs.replica_url.format(job_id=job_id, port=jobs.replica_port)


def bucket_volume(cfg: Any, namespace: str, read_only: bool) -> dict[str, Any]:
    return {"source": bucket_id(cfg.sync, namespace), "mount_path": cfg.sync.mount_path, "read_only": read_only}


def replica_job(cfg: Any, index: int, namespace: str, run_id: str) -> JobSpec:
    jobs = cfg.launcher.hf_jobs
    served = copy.deepcopy(cfg)
    served.inference.host = "0.0.0.0"  # reachable through the Jobs proxy, not only from inside the container
    launch = build_replica_launch(served, jobs.replica_port, "cuda", None, jobs.python)
    return JobSpec(
        name=safe_label(f"{run_id}-vllm-{index}"), role="replica", image=jobs.replica_image,
        flavor=jobs.replica_flavor, command=launch.argv, env=dict(launch.env), secrets=list(jobs.secrets),
        volumes=[bucket_volume(cfg, namespace, read_only=True)], labels=job_labels(cfg, run_id, "replica"),
        timeout_s=int(jobs.replica_timeout_s), expose=[jobs.replica_port],
        url=replica_url(cfg, f"<vllm-{index}-job-id>"))


def trainer_overrides(cfg: Any, user_overrides: list[str], namespace: str, run_id: str, urls: list[str]) -> list[str]:
    """The user's overrides, minus the keys the trainer Job owns, plus its role, the replicas and the bucket."""
    def owned(override: str) -> bool:
        key = override.split("=", 1)[0].lstrip("+~")
        return key.startswith("hydra.") or any(key == k or key.startswith(k + ".") for k in TRAINER_OWNED_KEYS)

    return [*(o for o in user_overrides if not owned(o)),
            "role=trainer", f"inference.urls=[{','.join(urls)}]", "inference.use_proxy=true",
            f"proxy.token_env={TOKEN_SECRET}", f"sync.bucket={bucket_id(cfg.sync, namespace)}",
            f"sync.output_dir={cfg.sync.output_dir}", f"hydra.run.dir={cfg.sync.output_dir}",
            f"launcher.hf_jobs.run_id={run_id}", f"launcher.hf_jobs.namespace={namespace}"]


def trainer_job(cfg: Any, user_overrides: list[str], namespace: str, run_id: str, urls: list[str],
                launch_id: str = "<launch-id>") -> JobSpec:
    jobs = cfg.launcher.hf_jobs
    agrpo = [jobs.python, "-m", "agrpo", *trainer_overrides(cfg, user_overrides, namespace, run_id, urls)]
    # The overrides travel as bash's positional arguments ("$@"), so no override is ever re-quoted for a shell.
    command = (["bash", "-c", f'pip install --no-cache-dir {shlex.quote(jobs.install)} && exec "$@"', "agrpo", *agrpo]
               if jobs.install else agrpo)
    secrets = list(dict.fromkeys([TOKEN_SECRET, *jobs.secrets]))
    return JobSpec(
        name=safe_label(f"{run_id}-trainer"), role="trainer", image=jobs.trainer_image, flavor=jobs.trainer_flavor,
        command=command, env={LAUNCH_ID_ENV: launch_id}, secrets=secrets,
        volumes=[bucket_volume(cfg, namespace, read_only=False)], labels=job_labels(cfg, run_id, "trainer"),
        timeout_s=int(jobs.trainer_timeout_s), attempts=int(jobs.trainer_attempts))


def build_jobs_plan(cfg: Any, user_overrides: list[str], namespace: str | None = None,
                    replica_ids: list[str] | None = None, launch_id: str = "<launch-id>") -> JobsPlan:
    """The whole plan. Without `namespace` or `replica_ids` (dry run), placeholders stand in for them."""
    namespace = namespace or NAMESPACE_PLACEHOLDER
    run_id = cfg.launcher.hf_jobs.run_id
    replicas = [replica_job(cfg, i, namespace, run_id) for i in range(cfg.inference.replicas)]
    if replica_ids is not None:
        for spec, job_id in zip(replicas, replica_ids):
            spec.url = replica_url(cfg, job_id)
    trainer = trainer_job(cfg, user_overrides, namespace, run_id, [r.url for r in replicas], launch_id)
    notes = [f"the trainer Job runs agrpo's proxy on 127.0.0.1 in front of {len(replicas)} replica URL(s), adding "
             f"the {TOKEN_SECRET} secret as a bearer token; it cancels the replicas when it ends"]
    return JobsPlan(run_id=run_id, namespace=namespace, bucket=bucket_id(cfg.sync, namespace),
                    run_dir=cfg.sync.output_dir, replicas=replicas, trainer=trainer, notes=notes)
