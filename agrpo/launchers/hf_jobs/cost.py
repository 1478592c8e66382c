"""What a Jobs run costs: before (the dry run's $/hour for the flavors the config picks) and after (each Job's running
time x its flavor's price, and $ per 1,000 samples trained).

Prices come from the Jobs API's hardware list (`HfApi.list_jobs_hardware`, priced per minute) when it can be read,
else from agrpo's table below, and every figure says which. Everything here is pure except `read_prices`.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import Any

# Estimated USD per hour by flavor, from Hugging Face's public Jobs pricing when this was written: the fallback when
# the hardware list cannot be read (and the dry run's estimate, which reads nothing).
PRICE_PER_HOUR_USD = {
    "cpu-basic": 0.01,
    "cpu-upgrade": 0.03,
    "t4-small": 0.40,
    "t4-medium": 0.60,
    "l4x1": 0.80,
    "l4x4": 3.80,
    "l40sx1": 1.80,
    "l40sx4": 8.30,
    "l40sx8": 23.50,
    "a10g-small": 1.00,
    "a10g-large": 1.50,
    "a10g-largex2": 3.00,
    "a10g-largex4": 5.00,
    "a100-large": 2.50,
    "a100x4": 10.00,
    "a100x8": 20.00,
    "h200": 5.00,
    "h200x2": 10.00,
    "h200x4": 20.00,
    "h200x8": 40.00,
}
HUB_SOURCE = "the Jobs API's hardware list"
TABLE_SOURCE = "agrpo's price table (the hardware list could not be read: an estimate)"
SECONDS_PER_UNIT = {"second": 1, "minute": 60, "hour": 3600}


@dataclass
class Prices:
    per_hour: dict[str, float]
    source: str  # HUB_SOURCE or TABLE_SOURCE: printed beside every figure

    def of(self, flavor: str) -> float | None:
        return self.per_hour.get(str(flavor))


def table_prices() -> Prices:
    return Prices(dict(PRICE_PER_HOUR_USD), TABLE_SOURCE)


def prices_from_hardware(hardware: list[Any]) -> dict[str, float]:
    """$/hour per flavor from `list_jobs_hardware()` entries (each priced per `unit_label`)."""
    per_hour = {}
    for entry in hardware:
        seconds = SECONDS_PER_UNIT.get(str(entry.unit_label).lower())
        if seconds:
            per_hour[str(entry.name)] = float(entry.unit_cost_usd) * 3600 / seconds
    return per_hour


def read_prices(api: Any) -> Prices:
    """The Jobs API's prices, or agrpo's table when the list cannot be read (I/O; never raises)."""
    try:
        per_hour = prices_from_hardware(api.list_jobs_hardware())
    except Exception:  # offline, refused, or an older Hub: the table, marked as an estimate
        return table_prices()
    return Prices(per_hour, HUB_SOURCE) if per_hour else table_prices()


@dataclass
class JobCost:
    name: str
    role: str
    flavor: str
    stage: str
    running_s: float
    usd: float | None  # None: no price for the flavor


def running_seconds(job: Any) -> float:
    """A Job's billed time: the Hub's `durations.running_secs`, else finished (or now) minus started."""
    durations = getattr(job, "durations", None)
    if durations is not None and durations.running_secs is not None:
        return float(durations.running_secs)
    started, finished = getattr(job, "started_at", None), getattr(job, "finished_at", None)
    if started is None:
        return 0.0
    if finished is None:
        from datetime import datetime, timezone

        finished = datetime.now(timezone.utc)
    return max(0.0, (finished - started).total_seconds())


def job_costs(jobs: list[Any], prices: Prices) -> list[JobCost]:
    costs = []
    for job in jobs:
        labels = job.labels or {}
        flavor = str(getattr(job.flavor, "value", job.flavor))
        seconds = running_seconds(job)
        price = prices.of(flavor)
        stage = getattr(job.status.stage, "value", str(job.status.stage))
        cost = JobCost(labels.get("name", job.id), labels.get("agrpo-role", "?"), flavor, stage, seconds, None)
        cost.usd = None if price is None else price * seconds / 3600
        costs.append(cost)
    return costs


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def total_usd(costs: list[JobCost]) -> float:
    return sum(c.usd or 0.0 for c in costs)


def samples_trained(log_history: list[dict[str, Any]], steps: int | None = None) -> int | None:
    """Samples the optimizer trained on: the mean samples per step TRL logged x the steps taken."""
    per_step = [float(e["batch/samples_per_step"]) for e in log_history if e.get("batch/samples_per_step")]
    steps = steps or max((int(e.get("step", 0)) for e in log_history), default=0)
    if not per_step or not steps:
        return None
    return round(fmean(per_step) * steps)


def cost_lines(costs: list[JobCost], prices: Prices, samples: int | None = None, label: str = "cost") -> list[str]:
    """The spend of a run's Jobs: the total (and per 1,000 samples trained), then one line per Job."""
    total = total_usd(costs)
    running = sum(c.running_s for c in costs)
    head = f"  {label:<12} ${total:.2f} for {duration(running)} of Job time (prices: {prices.source})"
    unknown = sorted({c.flavor for c in costs if c.usd is None})
    if unknown:
        head += f"; no price for {', '.join(unknown)}"
    lines = [head]
    if samples:
        lines.append(f"  {'per sample':<12} ${total * 1000 / samples:.2f} per 1,000 samples trained ({samples:,})")
    for c in costs:
        usd = "price unknown" if c.usd is None else f"${c.usd:.2f}"
        lines.append(f"    {c.role:<8} {c.name:<28} {c.flavor:<12} {c.stage:<10} {duration(c.running_s):>7}  {usd}")
    return lines


@dataclass
class RunEstimate:
    """The dry run's cost range for the whole run (pure): the fleet's range x an estimated duration (trainer.max_steps
    x launcher.hf_jobs.estimated_step_s), from agrpo's price table. An estimate: the run's own step time decides."""

    steps: int
    step_s: float
    min_replicas: int
    max_replicas: int
    replica_per_hour: float | None  # None: the flavor is not in the table
    trainer_per_hour: float | None
    trainer_timeout_s: float

    def hours(self) -> float:
        return self.steps * self.step_s / 3600

    def per_hour(self, replicas: int) -> float:
        return (self.trainer_per_hour or 0.0) + replicas * (self.replica_per_hour or 0.0)

    def usd_range(self) -> tuple[float, float]:
        return self.per_hour(self.min_replicas) * self.hours(), self.per_hour(self.max_replicas) * self.hours()

    def cap_usd(self) -> float:
        """The most the run can cost: the trainer Job at its timeout with the largest fleet serving all along."""
        return self.per_hour(self.max_replicas) * self.trainer_timeout_s / 3600

    def render(self) -> str:
        low, high = self.usd_range()
        fleet = str(self.min_replicas)
        if self.max_replicas != self.min_replicas:
            fleet += f"..{self.max_replicas}"
        spread = f"${low:.2f}" if low == high else f"${low:.2f}..${high:.2f}"
        line = (
            f"estimated cost of the whole run: {spread} for {fleet} replica Job(s) + 1 trainer Job over ~"
            f"{duration(self.hours() * 3600)} (trainer.max_steps={self.steps} x launcher.hf_jobs.estimated_step_s="
            f"{self.step_s:g} s; an estimate: the run's own step time decides); at most ${self.cap_usd():.2f} "
            f"(launcher.hf_jobs.trainer_timeout_s={self.trainer_timeout_s:g} with {self.max_replicas} replica(s))"
        )
        if self.replica_per_hour is None or self.trainer_per_hour is None:
            line += "; a flavor without a price counts $0"
        return line
