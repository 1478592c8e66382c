"""The HF Jobs plan as plain data: everything a launch does, so the dry run prints exactly what the executor runs.

A plan holds the preparation (the wheel built from the local package, this machine's model folder or data file when
the config names one, the resolved config the trainer Job runs from, all uploaded into the run's folder on the
bucket), every Job (image, flavor, command, env, secret names, volumes, exposed ports, labels, timeout) and the
executor's settings (polling, readiness, requeue, detach). The executor (executor.py) takes only this; it computes
nothing from the config. Secrets appear here by name only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from agrpo.launchers.plan import SAFE_ENV_VALUES, ProcessSpec, shown_command, substitute

from agrpo.launchers.hf_jobs.cost import PRICE_PER_HOUR_USD

RUN_LABEL, ROLE_LABEL, LAUNCH_LABEL = "agrpo-run", "agrpo-role", "agrpo-launch"
TOKEN_SECRET = "HF_TOKEN"  # the secret the proxy sends upstream and the trainer Job lists/cancels replicas with
LAUNCH_ID_ENV = "AGRPO_LAUNCH_ID"  # tells the attempts of one trainer Job apart from a later relaunch
NAMESPACE_PLACEHOLDER = "<namespace>"


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

        volumes = [
            Volume(type="bucket", source=v["source"], mount_path=v["mount_path"], read_only=v["read_only"])
            for v in self.volumes
        ]
        return dict(
            image=self.image,
            command=list(self.command),
            env=dict(self.env),
            secrets={name: secret_values[name] for name in self.secrets} or None,
            flavor=self.flavor,
            timeout=self.timeout_s,
            attempts=self.attempts if self.attempts > 1 else None,
            name=self.name,
            labels=dict(self.labels),
            volumes=volumes or None,
            expose=list(self.expose) or None,
            namespace=namespace,
        )

    def render(self) -> str:
        safe = SAFE_ENV_VALUES | {LAUNCH_ID_ENV}
        env = " ".join(f"{k}={v if k in safe else '<set>'}" for k, v in sorted(self.env.items()))
        price = PRICE_PER_HOUR_USD.get(self.flavor)
        lines = [
            f"[{self.role}] {self.name}",
            f"  image: {self.image}  flavor: {self.flavor} (~${price:.2f}/h)"
            if price is not None
            else f"  image: {self.image}  flavor: {self.flavor} (price unknown)",
            f"  timeout: {self.timeout_s} s" + (f"  attempts: {self.attempts}" if self.attempts > 1 else ""),
            f"  cmd: {shlex.join(self.command)}",
        ]
        if env:
            lines.append(f"  env: {env}")
        if self.secrets:
            lines.append(f"  secrets: {' '.join(self.secrets)} (values never shown)")
        for v in self.volumes:
            lines.append(
                f"  volume: bucket {v['source']} -> {v['mount_path']} "
                f"({'read-only' if v['read_only'] else 'read-write'})"
            )
        if self.expose:
            lines.append(f"  ports: {', '.join(map(str, self.expose))} -> {self.url}")
        lines.append(f"  labels: {' '.join(f'{k}={v}' for k, v in sorted(self.labels.items()))}")
        return "\n".join(lines)


@dataclass
class WheelBuild:
    """The file the trainer Job installs: `pip wheel --no-deps --no-build-isolation` of the local source tree, or,
    for an agrpo installed without its source, the installed files packed back into a wheel (repack.py)."""

    package_root: str  # the source tree; with from_installed, the site-packages folder agrpo is installed in
    filename: str  # agrpo-<version>-py3-none-any.whl: checked against what is built
    path_in_bucket: str
    python: str  # the interpreter that runs agrpo here builds it
    from_installed: bool = False

    def argv(self, work_dir: str) -> list[str]:
        """Built from `<work_dir>/src`, a copy of package_root (so nothing is written into it), into work_dir."""
        return [
            self.python,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            work_dir,
            f"{work_dir}/src",
        ]


@dataclass
class LocalInput:
    """A model folder, data file or chat template on this machine that the Jobs read from the bucket instead: built
    first when the config names a builder, then uploaded into the run's folder; the Jobs' config names `job_path`."""

    key: str  # the config key it replaces: model.name_or_path, data.path or model.chat_template
    source: str  # here
    path_in_bucket: str  # a folder's files go under it, a file is it
    job_path: str  # the same thing through the bucket mount, as the Jobs see it
    builder: str | None = None  # model.builder: run here (into source) before the upload ...
    builder_input: str | None = None  # ... from model.builder_input

    def render(self, bucket: str) -> str:
        built = f"build {self.source} with {self.builder}; " if self.builder else ""
        return (
            f"prepare: {built}upload {self.key}={self.source} to bucket {bucket}:{self.path_in_bucket} "
            f"(the Jobs read {self.job_path})"
        )


@dataclass
class ConfigUpload:
    """The resolved config the trainer Job runs from (`python -m agrpo.launchers.hf_jobs.trainer <path>`)."""

    path_in_bucket: str
    text: str

    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


@dataclass
class LaunchRecord:
    """The command that launched the run (Hydra's overrides), kept in the run's folder as `.hydra/overrides.yaml`, as
    in a local run dir: `agrpo push` writes it into the model card, and a pulled folder says how it was trained."""

    path_in_bucket: str
    text: str


@dataclass
class AfterRun:
    """What the launching machine prints when the run ends: what it cost, and commands that work there (pull the
    run's folder first, then evaluate, plot, share and serve the pulled copy)."""

    run_name: str
    pull_dir: str  # where `agrpo pull` puts the run's folder: outputs/<run_name>/<run_id>
    bucket_name: str  # sync.bucket without the namespace (agrpo pull's --bucket when it is not the default)
    eval_overrides: list[str]  # the launch's overrides that say what was trained (recipe, model, LoRA, data, reward)
    base_model: str  # as this machine names it: a local model's folder here, not its copy in the bucket
    served_rank: int  # the run's inference.max_lora_rank: the LoRA capacity its replicas served the adapter with
    samples_per_step: int | None  # for $ per 1,000 samples when TRL's log cannot be read
    launch_log: str | None = None  # <local run dir>/logs/launch.log: HTTP requests, Job states (None: no run dir)


@dataclass
class Watch:
    """How the executor waits and follows: the launcher.hf_jobs knobs it needs, copied in at plan time."""

    replica_url: str  # pattern with {job_id} and {port}
    replica_port: int
    ready_timeout_s: float
    poll_interval_s: float
    trainer_attempts: int
    requeue_grace_s: float
    detach: bool


@dataclass
class JobsPlan:
    run_id: str
    launch_id: str
    namespace: str
    bucket: str
    run_dir: str  # sync.output_dir: the run's folder on the bucket mount
    replicas: list[JobSpec]
    trainer: JobSpec
    config: ConfigUpload
    watch: Watch
    wheel: WheelBuild | None = None  # None: the trainer installs a pinned requirement or its image has agrpo
    inputs: list[LocalInput] = field(default_factory=list)  # this machine's model/data, uploaded for the Jobs
    launcher: str = "hf_jobs"
    notes: list[str] = field(default_factory=list)
    # The Hub backend's own lines (where the plan runs; none for the real Hub) and whether its Jobs run on this
    # machine (then nothing is billed: the costs are what the flavors would cost).
    hub_lines: list[str] = field(default_factory=list)
    jobs_on_this_machine: bool = False
    launch_record: LaunchRecord | None = None  # None: launched without Hydra (the API, tests): nothing to record
    after: AfterRun | None = None
    # What the trainer Job starts inside (agrpo/launchers/hf_jobs/trainer.py: the local plan with role=trainer):
    # agrpo's proxy in front of the replica Jobs, then the trainer. Ports, GPUs and threads are the Job's own.
    in_job: list[ProcessSpec] = field(default_factory=list)
    # inference.replicas=auto: the replica Job template the trainer Job launches from (fleet.py: JobsFleet), and the
    # whole run's cost range (cost.py: RunEstimate). Any: plan.py does not import them (they import JobSpec).
    fleet: Any = None
    estimate: Any = None

    def jobs(self) -> list[JobSpec]:
        return [*self.replicas, self.trainer]

    def files(self) -> list[tuple[bytes, str]]:
        """The small records the executor uploads beside the wheel and inputs: the run config, the fleet record."""
        files = [(self.config.text.encode(), self.config.path_in_bucket)]
        if self.fleet is not None:
            files.append((self.fleet.to_json().encode(), self.fleet.path_in_bucket))
        return files

    def cost_per_hour(self) -> tuple[float, list[str]]:
        """(estimated USD per hour of every Job together, flavors missing from the price table)."""
        flavors = [job.flavor for job in self.jobs()]
        return (
            sum(PRICE_PER_HOUR_USD.get(f, 0.0) for f in flavors),
            sorted({f for f in flavors if f not in PRICE_PER_HOUR_USD}),
        )

    def replica_url(self, job_id: str) -> str:
        return self.watch.replica_url.format(job_id=job_id, port=self.watch.replica_port)

    def render(self) -> str:
        total, unknown = self.cost_per_hour()
        cost = f"estimated cost: ${total:.2f}/hour for {len(self.replicas)} replica Job(s) + 1 trainer Job"
        if self.fleet is not None:
            low, high = self.fleet.per_hour_range(self.trainer.flavor)
            cost = (
                f"estimated cost: ${low:.2f}..${high:.2f}/hour for {self.fleet.min_replicas}..{self.fleet.max_replicas}"
                " replica Job(s) + 1 trainer Job"
            )
        cost += f" (no price known for {unknown})" if unknown else ""
        parts = [
            f"agrpo plan (hf_jobs), run id {self.run_id}, launch {self.launch_id}, namespace {self.namespace}",
            f"bucket {self.bucket}; run dir {self.run_dir} (adapters, checkpoints, TensorBoard, final adapter)",
            f"{cost} (an estimate from agrpo's price table; HfApi().list_jobs_hardware() has current prices)",
        ]
        if self.estimate is not None:
            parts.append(self.estimate.render())
        if self.wheel and self.wheel.from_installed:
            parts.append(
                f"prepare: pack the agrpo installed in {self.wheel.package_root} (no source tree) into "
                f"{self.wheel.filename} -> upload to bucket {self.bucket}:{self.wheel.path_in_bucket}"
            )
        elif self.wheel:
            parts.append(
                f"prepare: copy {self.wheel.package_root} (sources only) to <tmp>/src; "
                f"{shlex.join(self.wheel.argv('<tmp>'))} -> upload {self.wheel.filename} to bucket "
                f"{self.bucket}:{self.wheel.path_in_bucket}"
            )
        parts += [item.render(self.bucket) for item in self.inputs]
        parts.append(
            f"prepare: upload the resolved run config ({len(self.config.text.splitlines())} lines, sha256 "
            f"{self.config.digest()}) to bucket {self.bucket}:{self.config.path_in_bucket}"
        )
        if self.launch_record:
            parts.append(
                f"prepare: upload the launch command (Hydra's overrides) to bucket {self.bucket}:"
                f"{self.launch_record.path_in_bucket}"
            )
        parts += [f"note: {note}" for note in self.notes]
        if self.after:
            parts.append(
                f"after the run: `agrpo pull {self.run_id}` downloads its folder (final adapter, metrics, curves, "
                f"TensorBoard, config, logs) into {self.after.pull_dir}; the end of the run prints what it cost"
            )
        parts += self.hub_lines
        if self.in_job:
            parts.append("inside the trainer Job (its own ports, GPUs and threads, chosen there):")
            parts += [f"  [{spec.role}] {spec.name}\n    cmd: {shown_command(spec.argv)}" for spec in self.in_job]
        parts += [job.render() for job in self.jobs()]
        if self.fleet is not None:
            parts += self.fleet.render(self.bucket)
        return "\n".join(parts)


def bind_namespace(plan: JobsPlan, namespace: str) -> JobsPlan:
    """The plan with the `<namespace>` placeholder (dry run without launcher.hf_jobs.namespace) replaced by the
    token's user, looked up at launch: the only value a dry run cannot know offline. Everything else is unchanged."""
    return bind_placeholder(plan, NAMESPACE_PLACEHOLDER, namespace)


def bind_placeholder(plan: JobsPlan, placeholder: str, value: str) -> JobsPlan:
    """The plan with every occurrence of `placeholder` in its strings replaced by `value`."""
    if placeholder not in json.dumps(dataclasses.asdict(plan)):
        return plan
    return substitute(plan, lambda text: text.replace(placeholder, value))
