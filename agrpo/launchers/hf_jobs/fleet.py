"""inference.replicas=auto on Jobs, as plan data (pure): the launcher starts `min_replicas` replica Jobs, and the
trainer Job launches and cancels the others itself (agrpo/launchers/hf_jobs/fleet_jobs.py) as the fleet policy
decides (agrpo/fleet/).

Every replica Job the trainer Job launches is the plan's `replica` template (image, flavor, command, env, secret
names, bucket volume, exposed port, labels, timeout: what the dry run prints), named `<run_id>-vllm-<n>`. The
launcher uploads this record to the run's folder (`fleet.json`), and the trainer Job reads it there: it launches what
the dry run printed, never a spec of its own. A record that cannot be read refuses the run with one paragraph naming
the file (agrpo/interprocess.py): guessing a Job template would launch Jobs nobody reviewed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from agrpo.config.schema import RunConfig
from agrpo.errors import LaunchError
from agrpo.interprocess import BadInput, parse_json, refusal
from agrpo.launchers.hf_jobs.cost import PRICE_PER_HOUR_USD, RunEstimate
from agrpo.launchers.hf_jobs.plan import JobSpec

FLEET_FILE = "fleet.json"


@dataclass
class JobsFleet:
    min_replicas: int
    max_replicas: int
    replica: JobSpec  # the template of every replica Job the trainer Job launches
    name_prefix: str  # <run_id>-vllm-: a launched Job is <name_prefix><n>
    policy: dict[str, float] = field(default_factory=dict)  # inference.fleet.*
    inflight_ceiling: int | None = None
    path_in_bucket: str = ""  # where the launcher uploads this record
    job_path: str = ""  # the same file through the trainer Job's bucket mount

    def spec(self, index: int) -> JobSpec:
        """The replica Job number `index` (its URL, a placeholder here, is known once the Job exists)."""
        return dataclasses.replace(self.replica, name=f"{self.name_prefix}{index}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = FLEET_FILE) -> JobsFleet:
        """The record the launcher wrote, or a LaunchError naming `source` and what is wrong with it."""
        try:
            data = parse_json(text)
            if not isinstance(data, dict) or not isinstance(data.get("replica"), dict):
                raise BadInput("it is not a fleet record (an object with a `replica` Job template)")
            data["replica"] = JobSpec(**data["replica"])
            return cls(**data)
        except (BadInput, TypeError) as error:  # TypeError: fields this version does not know, or lacks
            bad = error if isinstance(error, BadInput) else BadInput(f"its fields do not match this agrpo ({error})")
            raise LaunchError(
                refusal(
                    source,
                    bad,
                    "The trainer Job launches replica Jobs only from the template the launcher uploaded",
                    "launch the run again from the same agrpo version (it uploads the record anew)",
                )
            ) from None

    def per_hour_range(self, trainer_flavor: str) -> tuple[float, float]:
        """$ per hour of every Job together with the fewest and the most replicas (agrpo's price table)."""
        trainer = PRICE_PER_HOUR_USD.get(trainer_flavor, 0.0)
        replica = PRICE_PER_HOUR_USD.get(self.replica.flavor, 0.0)
        return trainer + self.min_replicas * replica, trainer + self.max_replicas * replica

    def render(self, bucket: str) -> list[str]:
        knobs = ", ".join(f"{key}={value:g}" for key, value in self.policy.items())
        template = self.spec(self.min_replicas).render().replace("\n", "\n  ")
        return [
            f"[fleet] auto: {self.min_replicas}..{self.max_replicas} replica Jobs; the launcher starts "
            f"{self.min_replicas}, the trainer Job launches and cancels the others one at a time from the run's "
            f"signals, drains a replica before it cancels its Job, and replaces a lost one (preempted, failed) while "
            f"the fleet is below min_replicas={self.min_replicas} ({knobs})",
            f"prepare: upload this fleet record (the replica Job template below) to bucket {bucket}:"
            f"{self.path_in_bucket}; the trainer Job reads it at {self.job_path}",
            f"  {template.replace('] ', '] (on demand, launched by the trainer Job) ', 1)}",
        ]


def jobs_fleet(cfg: RunConfig, template: JobSpec, run_id: str, run_dir: str, run_dir_in_bucket: str) -> JobsFleet:
    """The fleet record of an auto run from its config and the replica Job template (planner.replica_job)."""
    from agrpo.config.schema.trainer import is_auto
    from agrpo.launchers.local import fleet_policy_knobs

    inference = cfg.inference
    ceiling = cfg.trainer.inflight_slots if is_auto(cfg.trainer.max_inflight_tasks) else None
    return JobsFleet(
        min_replicas=int(inference.min_replicas),
        max_replicas=int(inference.max_replicas),
        replica=template,
        name_prefix=f"{run_id}-vllm-",
        policy=fleet_policy_knobs(inference.fleet),
        inflight_ceiling=ceiling,
        path_in_bucket=f"{run_dir_in_bucket}/{FLEET_FILE}",
        job_path=f"{run_dir}/{FLEET_FILE}",
    )


def run_estimate(cfg: RunConfig, fewest: int, most: int) -> RunEstimate:
    jobs = cfg.launcher.hf_jobs
    return RunEstimate(
        steps=int(cfg.trainer.max_steps),
        step_s=float(jobs.estimated_step_s),
        min_replicas=fewest,
        max_replicas=most,
        replica_per_hour=PRICE_PER_HOUR_USD.get(str(jobs.replica_flavor)),
        trainer_per_hour=PRICE_PER_HOUR_USD.get(str(jobs.trainer_flavor)),
        trainer_timeout_s=float(jobs.trainer_timeout_s),
    )
