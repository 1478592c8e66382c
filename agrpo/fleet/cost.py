"""What a fleet cost, at the end of a run (pure): replica-seconds by fleet size, $ per 1,000 samples trained, and what
the largest fixed fleet (max_replicas for the whole run) would have cost for the same run.

"The same run" is the same wall time: a larger fleet might have finished sooner, so the comparison favours neither
side by guessing how much (benchmarks/fleet_simulation.py and benchmarks/elastic.py measure that). A price per
replica-hour comes from the replica Jobs' flavor (launcher=hf_jobs) or from inference.fleet.replica_price_per_hour
(local runs; 0: replica-seconds only).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FleetBill:
    seconds_by_size: dict[
        int, float
    ]  # wall seconds the fleet spent at each size (replicas that cost, booting ones too)
    max_replicas: int
    samples: int | None = None  # samples the optimizer trained on
    price_per_hour: float | None = None  # $ per replica-hour; None or 0: replica-seconds only
    source: str = ""  # where the price comes from, printed beside it

    def wall_seconds(self) -> float:
        return sum(self.seconds_by_size.values())

    def replica_seconds(self) -> float:
        return sum(size * seconds for size, seconds in self.seconds_by_size.items())

    def fixed_replica_seconds(self) -> float:
        """The largest fixed fleet for the same wall time."""
        return self.max_replicas * self.wall_seconds()

    def usd(self, replica_seconds: float) -> float | None:
        if not self.price_per_hour:
            return None
        return replica_seconds * self.price_per_hour / 3600


def per_thousand(usd: float | None, samples: int | None) -> str:
    if usd is None or not samples:
        return ""
    per = usd * 1000 / samples
    return f", ${per:.2f} per 1,000 samples" if per >= 0.1 else f", ${per:.4f} per 1,000 samples"


def by_size(seconds_by_size: dict[int, float]) -> str:
    return ", ".join(
        f"{size} replica(s) {seconds:.0f} s" for size, seconds in sorted(seconds_by_size.items()) if seconds
    )


def fleet_cost_lines(bill: FleetBill) -> list[str]:
    """What the fleet used and cost (replica-seconds by fleet size; with a price, $ and $ per 1,000 samples), then the
    largest fixed fleet's figures for the same run."""
    used, fixed, wall = bill.replica_seconds(), bill.fixed_replica_seconds(), bill.wall_seconds()
    used_usd, fixed_usd = bill.usd(used), bill.usd(fixed)
    lines = [f"  used         {used:.0f} replica-seconds ({by_size(bill.seconds_by_size) or 'none'})"]
    if bill.samples:
        lines[0] += f" for {bill.samples:,} samples trained"
    if used_usd is not None:
        lines[0] += f": ${used_usd:.2f}{per_thousand(used_usd, bill.samples)}"
    fixed_line = f"  fixed max    {bill.max_replicas} replica(s) for the same {wall:.0f} s: {fixed:.0f} replica-seconds"
    if fixed_usd is not None:
        fixed_line += f": ${fixed_usd:.2f}{per_thousand(fixed_usd, bill.samples)}"
    if fixed > 0:
        fixed_line += f"; auto used {used / fixed:.0%} of it"
    lines.append(fixed_line)
    if used_usd is not None:
        lines.append(f"  (priced at ${bill.price_per_hour:.2f} per replica-hour: {bill.source or 'the price given'})")
    return lines
