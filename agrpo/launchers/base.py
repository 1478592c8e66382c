"""The launcher interface: build a plan from the config (pure), then execute it (I/O). New launchers (accelerate,
HF Jobs) register here and are chosen with `launcher=NAME`; nothing else changes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from agrpo.config.schema import RunConfig
from agrpo.launchers.plan import Plan
from agrpo.plugins import lookup


class Launcher(ABC):
    name: str

    @abstractmethod
    def build_plan(self, cfg: RunConfig) -> Plan:
        """Everything the run will start, as data, from the prepared spec. Must not start processes."""

    @abstractmethod
    def execute(self, plan: Plan) -> dict[str, Any]:
        """Run the plan to completion, always stopping what it started; return the run's final metrics. The plan is
        all an executor reads: what the dry run printed is what runs."""


LAUNCHERS: dict[str, type[Launcher]] = {}


def register(cls: type[Launcher]) -> type[Launcher]:
    LAUNCHERS[cls.name] = cls
    return cls


def get_launcher(name: str, **options: Any) -> Launcher:
    """The launcher registered under `name`; its module `agrpo/launchers/<name>.py` registers it on import.
    `options` go to its constructor (launcher=hf_jobs: `hub`, the Hub backend it runs on)."""
    return lookup(LAUNCHERS, "agrpo.launchers", name, "launcher.name")(**options)
