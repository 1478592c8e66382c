"""The executor's half of a plan's placeholders: the run's ports reserved and its secrets made when the plan runs.

A plan names them only (agrpo/launchers/plan.py: `Placeholders`), so that building one has no side effect; the
local executor, `agrpo eval` and the trainer Job's launcher run `with bound(plan) as running:` and start exactly
`running`, which is `bind(plan, values)` for the values made here.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator

from agrpo.launchers.plan import Placeholders, Plan, bind, port_placeholder, secret_placeholder
from agrpo.processes.ports import PortReservation, reserve_ports

log = logging.getLogger(__name__)


def make_values(placeholders: Placeholders, reservations: list[PortReservation]) -> dict[str, str]:
    """A value for each placeholder: its group's ports reserved (each reservation appended to `reservations` at once,
    for the caller to release even when a later group finds no ports) and fresh secrets, new for every run."""
    values: dict[str, str] = {}
    for group in placeholders.ports:
        reservation = reserve_ports(len(group.names), group.start, group.host)
        reservations.append(reservation)
        values.update({port_placeholder(name): str(port) for name, port in zip(group.names, reservation.ports)})
    for name in placeholders.secrets:
        values[secret_placeholder(name)] = secrets.token_urlsafe(32)
    return values


@contextlib.contextmanager
def bound(plan: Plan) -> Iterator[Plan]:
    """`plan` with its values made now: the ports held until the block ends (no other run takes them while this one
    starts its servers on them), the secrets this run's alone."""
    reservations: list[PortReservation] = []
    try:
        values = make_values(plan.placeholders, reservations)
        ports = [
            f"{name}={values[port_placeholder(name)]}" for group in plan.placeholders.ports for name in group.names
        ]
        if ports:
            log.info("this run's ports: %s", ", ".join(ports))
        yield bind(plan, values)
    finally:
        for reservation in reservations:
            reservation.release()
