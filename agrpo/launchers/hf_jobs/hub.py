"""The Hub backend a Jobs launch talks to, and the one place that picks it.

The Jobs launcher plans and executes against a backend: the real Hub (huggingface_hub's HfApi, `RealHub`), or a
stand-in of it on this machine, which agrpo's own command line chooses (`python -m agrpo ... launcher=hf_jobs
sync=bucket --rehearse`, docs/hf_jobs.md "Rehearse first"; `agrpo pull|jobs ... --rehearsal-dir DIR` for a finished
one). The choice is not a config key: the config says what runs, the backend where. Everything else asks the backend
for a capability (`jobs_on_this_machine`, `replica_url`, `plan_lines`, `detail_loggers`) and talks to what
`connect` yields (its API, token, how an exposed URL is reached, the plan's placeholders it fills in).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from agrpo.launchers.hf_jobs.cost import PRICE_PER_HOUR_USD


class Connection(Protocol):
    api: Any  # an HfApi (or one on the stand-in)
    namespace: str  # the user or org the Jobs run in
    token: str | None  # None: huggingface_hub's own (HF_TOKEN or the saved login)
    reach: Callable[[str], str]  # how this process reaches an exposed URL
    replay: list[str]  # what `agrpo pull` / `agrpo jobs` need to find this run again
    placeholders: dict[str, str]  # placeholders of the plan only the running backend knows -> their values
    outcome: dict[str, Any]  # added to the run's final metrics


class HubBackend(Protocol):
    """What the Jobs launcher needs of the Hub it runs on."""

    jobs_on_this_machine: bool  # the Jobs run here: the replicas serve on this machine's device; nothing is billed
    asked_by: str  # the command-line flag that chose it ("" for the Hub)
    detail_loggers: tuple[str, ...]  # its loggers' INFO lines go to the launch log, off the terminal

    def replica_url(self, configured: str) -> str:
        """The URL form (`{job_id}`, `{port}`) of a Job's exposed port, given launcher.hf_jobs.replica_url."""

    def plan_lines(self) -> list[str]:
        """What the plan says about where it runs (none for the Hub)."""

    def connect(self, namespace: str | None, prices: dict[str, float]) -> contextlib.AbstractContextManager:
        """The backend while the launch runs, yielding a Connection; `namespace` None: the token's user."""


@dataclass(frozen=True)
class HubConnection:
    api: Any
    namespace: str
    token: str | None = None
    reach: Callable[[str], str] = lambda url: url
    replay: list[str] = field(default_factory=list)
    placeholders: dict[str, str] = field(default_factory=dict)
    outcome: dict[str, Any] = field(default_factory=dict)


class RealHub:
    """huggingface_hub's HfApi on HF_ENDPOINT, with the saved token."""

    jobs_on_this_machine = False
    asked_by = ""
    detail_loggers: tuple[str, ...] = ()

    def replica_url(self, configured: str) -> str:
        return configured

    def plan_lines(self) -> list[str]:
        return []

    @contextlib.contextmanager
    def connect(self, namespace: str | None, prices: dict[str, float]) -> Iterator[HubConnection]:
        from agrpo.launchers.hf_jobs.client import make_api, resolve_namespace

        api = make_api()
        yield HubConnection(api, resolve_namespace(api, namespace))


def backend_from_argv(argv: list[str]) -> tuple[HubBackend | None, list[str], list[str]]:
    """(the backend agrpo's command line asks for, None for the Hub; argv without its flags; notes to print). The
    only place a launch picks a rehearsal (agrpo/rehearsal/backend.py reads its flags)."""
    from agrpo.rehearsal.backend import RehearsalHub, rehearsal_flags

    settings, rest, notes = rehearsal_flags(argv)
    return (RehearsalHub(settings) if settings else None), rest, notes


def add_replay_flag(parser: argparse.ArgumentParser) -> None:
    """`--rehearsal-dir DIR` of `agrpo pull` and `agrpo jobs`: a finished rehearsal's folder instead of the Hub."""
    parser.add_argument(
        "--rehearsal-dir",
        dest="replay_dir",
        help="a finished rehearsal's folder (its --rehearsal-dir) instead of the Hub",
    )


@contextlib.contextmanager
def finished_run_hub(replay_dir: str | None) -> Iterator[tuple[Any, str | None]]:
    """(api, its namespace when known): the Hub's, or a finished rehearsal's replayed through the same API."""
    if replay_dir:
        from agrpo.rehearsal.backend import replayed

        with replayed(replay_dir, PRICE_PER_HOUR_USD) as found:
            yield found
        return
    from agrpo.launchers.hf_jobs.client import make_api

    yield make_api(), None
