"""What a shared fleet's tenants used, kept by `agrpo fleet up` for its summary (fleet_summary.json).

The proxy's `GET /fleet/tenants` lists the tenants registered now; a run that ended is forgotten there (its adapters
unloaded). So the fleet reads it every few seconds and keeps each tenant's latest figures, including those of runs
that already left: a departed run's last seconds (at most one reading's interval) are the only thing missed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agrpo.fleet.status import fleet_tenants

READ_EVERY_S = 2.0


@dataclass
class TenantLedger:
    url: str
    admin_token: str
    every_s: float = READ_EVERY_S
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)  # tenant id -> its latest entry (+ "gone")
    totals: dict[str, Any] = field(default_factory=dict)  # the latest fleet totals
    problem: str = "the proxy was never read"
    _last: float = float("-inf")

    def poll(self, force: bool = False, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        answer, problem = fleet_tenants(self.url, self.admin_token)
        if answer is None:
            self.problem = problem
            return
        self.take(answer)

    def gate_waits(self) -> dict[str, float]:
        """Each attached tenant's seconds waited at the proxy's fair-share gate, as last read (the fleet controller's
        TenantSteps turns them into starvation: agrpo/fleet/signals.py `starvation`)."""
        return {
            tenant: float(entry["gate_wait_s"])
            for tenant, entry in self.tenants.items()
            if not entry.get("gone") and entry.get("gate_wait_s") is not None
        }

    def take(self, answer: dict[str, Any]) -> None:
        """One typed answer: its tenants' entries replace their earlier ones; tenants absent from it are gone."""
        self.problem = ""
        present = {entry["tenant"] for entry in answer.get("tenants", [])}
        for tenant, entry in self.tenants.items():
            if tenant not in present:
                entry["gone"] = True
        for entry in answer.get("tenants", []):
            self.tenants[entry["tenant"]] = {**entry, "gone": False}
        self.totals = {key: value for key, value in answer.items() if key != "tenants"}

    def summary(
        self, name: str, replica_seconds: float, began: float, ready_at: float, ended: float, stopped_by: str
    ) -> dict[str, Any]:
        """fleet_summary.json (pure): the fleet's replica-seconds (every replica from its start to its stop), those
        the proxy attributed (in rotation) and each tenant's share of these."""
        served = float(self.totals.get("replica_seconds") or 0.0)
        tenants = []
        for entry in sorted(self.tenants.values(), key=lambda e: -float(e.get("replica_seconds", 0.0))):
            seconds = float(entry.get("replica_seconds", 0.0))
            tenants.append(
                {
                    "tenant": entry["tenant"],
                    "run": entry.get("run", ""),
                    "tokens": int(entry.get("tokens", 0)),
                    "requests": int(entry.get("requests", 0)),
                    "replica_seconds": round(seconds, 1),
                    "share": round(seconds / served, 4) if served > 0 else None,
                    "left_before_the_end": bool(entry.get("gone")),
                }
            )
        return {
            "fleet": name,
            "stopped_by": stopped_by,
            "started_at": began,
            "ready_after_s": round(ready_at - began, 1),
            "up_s": round(ended - began, 1),
            "replica_seconds": round(replica_seconds, 1),
            "attributed_replica_seconds": round(served, 1) if self.totals else None,
            "idle_replica_seconds": self.totals.get("idle_replica_seconds"),
            "tenants": tenants,
            "tenant_figures": "" if not self.problem else f"unknown: {self.problem}",
        }


def summary_lines(summary: dict[str, Any], shown: int = 4) -> list[str]:
    """At most three console lines of a fleet's summary (pure)."""
    idle = summary.get("idle_replica_seconds")
    lines = [
        f"fleet {summary['fleet']} stopped ({summary['stopped_by']}) after {summary['up_s']:.0f} s: "
        f"{summary['replica_seconds']:.0f} replica-seconds"
        + (f" ({summary['attributed_replica_seconds']:.0f} in rotation, {idle:.0f} idle)" if idle is not None else "")
    ]
    tenants = summary["tenants"]
    if tenants:
        parts = [
            f"{t['tenant']} {t['share']:.0%}" if t["share"] is not None else f"{t['tenant']} ?" for t in tenants[:shown]
        ]
        more = f", +{len(tenants) - shown} more" if len(tenants) > shown else ""
        attached = sum(not t["left_before_the_end"] for t in tenants)
        still = f"; {attached} run(s) still attached lost their fleet" if attached else ""
        lines.append(
            f"fleet {summary['fleet']}: tenants' shares: {', '.join(parts)}{more} (by tokens generated){still}"
        )
    elif summary["tenant_figures"]:
        lines.append(f"fleet {summary['fleet']}: tenants' shares {summary['tenant_figures']}")
    else:
        lines.append(f"fleet {summary['fleet']}: no run attached")
    return lines
