"""Keep local replicas up while the trainer runs: a replica that dies is started again on its port.

Why: with several replicas the proxy routes around a dead one and training goes on, but at half the generation
capacity for the rest of the run. Restarting it is enough: the proxy probes replicas it marked unhealthy and
re-admits one only after replaying the adapters currently loaded (agrpo/proxy/control.py), so the restarted
replica serves the current policy before it takes traffic. Restarts are budgeted (`inference.max_restarts`): a
replica that keeps dying (bad flags, out of memory) is given up on with one warning, never restarted in a loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)


class Restartable(Protocol):
    name: str

    def alive(self) -> bool: ...

    def start(self) -> None: ...


@dataclass
class ReplicaSupervisor:
    """Call `poll()` periodically; it restarts dead replicas within their budget and reports what it did."""

    replicas: Sequence[Restartable]
    max_restarts: int
    warn: Callable[[str], None] = log.warning
    restarts: dict[str, int] = field(default_factory=dict)
    given_up: set[str] = field(default_factory=set)

    def poll(self) -> list[str]:
        """Restart every dead replica that has budget left; return the names restarted this time."""
        restarted = []
        for replica in self.replicas:
            if replica.alive() or replica.name in self.given_up:
                continue
            used = self.restarts.get(replica.name, 0)
            if used >= self.max_restarts:
                self.given_up.add(replica.name)
                self.warn(
                    f"{replica.name} died again after {used} restart(s) (inference.max_restarts="
                    f"{self.max_restarts}); training goes on with the other replicas. Its log says why."
                )
                continue
            self.restarts[replica.name] = used + 1
            self.warn(
                f"{replica.name} died; restarting it ({used + 1} of {self.max_restarts}). The proxy "
                "re-admits it once it is healthy and holds the current adapters."
            )
            replica.start()
            restarted.append(replica.name)
        return restarted


def wait_supervised(
    trainer: "Waitable",
    supervisor: ReplicaSupervisor | None,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] | None = None,
    fleet: "Pollable | None" = None,
) -> int:
    """Wait for the trainer to exit, restarting dead replicas and letting the fleet controller (inference.replicas=auto,
    agrpo/fleet/controller.py) size the fleet meanwhile; return the trainer's exit code."""
    import time

    sleep = sleep or time.sleep
    while (supervisor is not None or fleet is not None) and trainer.alive():
        if supervisor is not None:
            supervisor.poll()
        if fleet is not None:
            fleet.poll()
        sleep(poll_s)
    return trainer.wait()


class Pollable(Protocol):
    def poll(self) -> None: ...


class Waitable(Protocol):
    def alive(self) -> bool: ...

    def wait(self) -> int: ...
