"""The rehearsal as a Hub backend: what the Jobs launcher is handed in place of the Hub when a run is rehearsed.

`--rehearse` (and its settings, `--rehearsal-dir DIR`, `--rehearsal-listing-lag-s S`, `--rehearsal-negative-cache-s
S`) sit on agrpo's own command line beside Hydra's overrides, never in the run's config: they say where the plan
runs, not what it runs. `rehearsal_flags` takes them out of argv (pure) before Hydra parses the rest; the old config
spellings (`rehearsal.enabled=true`, `launcher.hf_jobs.rehearse=true`, ...) are read as the flags with a note that
they are deprecated. `RehearsalHub` has the capabilities the launcher asks a backend for (the Jobs run on this
machine, an exposed port's URL form, the plan's lines about it) and `connect` starts the stand-in (rehearse.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from agrpo.errors import ConfigError

# The gateway port is known once the stand-in listens: the plan holds GATEWAY_PLACEHOLDER until then (rehearse.py).
from agrpo.rehearsal.rehearse import GATEWAY_PLACEHOLDER, REHEARSAL_NAMESPACE

# An exposed port is reached at its real host name over http on the stand-in's gateway port (the name resolves to
# the gateway inside rehearsal Jobs).
REPLICA_URL = "http://{job_id}--{port}.hf.jobs:" + GATEWAY_PLACEHOLDER
SWITCH = "--rehearse"
VALUE_FLAGS = {  # flag -> RehearsalSettings field
    "--rehearsal-dir": "dir",
    "--rehearsal-listing-lag-s": "listing_lag_s",
    "--rehearsal-negative-cache-s": "negative_cache_s",
}
DEPRECATED_KEYS = {  # a config key of older versions -> the flag it is read as
    "rehearsal.enabled": SWITCH,
    "launcher.hf_jobs.rehearse": SWITCH,
    "rehearsal.dir": "--rehearsal-dir",
    "launcher.hf_jobs.rehearse_dir": "--rehearsal-dir",
    "rehearsal.listing_lag_s": "--rehearsal-listing-lag-s",
    "launcher.hf_jobs.rehearse_listing_lag_s": "--rehearsal-listing-lag-s",
    "rehearsal.negative_cache_s": "--rehearsal-negative-cache-s",
    "launcher.hf_jobs.rehearse_negative_cache_s": "--rehearsal-negative-cache-s",
}
TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass(frozen=True)
class RehearsalSettings:
    """The stand-in's own settings (what it simulates of the Hub), the defaults of its flags."""

    listing_lag_s: float = 1.0  # a file landing in the bucket folder is listed this much later (the Hub's lag)
    negative_cache_s: float = 30.0  # a replica that looked for an adapter too early keeps not seeing it this long
    dir: str | None = None  # the Jobs' folders, logs and the bucket; None: a fresh temporary folder (kept, named)


def rehearsal_flags(argv: list[str]) -> tuple[RehearsalSettings | None, list[str], list[str]]:
    """(the settings when argv rehearses, else None; argv without the rehearsal's flags; notes to print). A flag
    without `--rehearse`, or a value that is not one, is a ConfigError naming the flag."""
    values: dict[str, Any] = {}
    switch, rest, notes, args = None, [], [], list(argv)
    while args:
        arg = args.pop(0)
        flag, sep, value = arg.partition("=")
        if flag in DEPRECATED_KEYS and sep:
            new = DEPRECATED_KEYS[flag]
            notes.append(
                f"{flag}={value} is deprecated (the rehearsal is not a config key any more): read as {new}"
                + ("" if new == SWITCH else f" {value}")
            )
            if new == SWITCH:
                switch = switch or truth(flag, value)
                continue
            flag = new
        elif flag == SWITCH and not sep:
            switch = True
            continue
        elif flag not in VALUE_FLAGS:
            rest.append(arg)
            continue
        if not sep:
            if not args:
                raise ConfigError(f"{flag} needs a value ({flag} VALUE or {flag}=VALUE)")
            value = args.pop(0)
        values[VALUE_FLAGS[flag]] = value
    if not switch:
        if values and switch is None:
            named = ", ".join(f"--rehearsal-{k.replace('_', '-')}" for k in values)
            raise ConfigError(
                f"{named} set without --rehearse: add --rehearse to rehearse the Jobs run on this machine"
            )
        return None, rest, notes
    return settings_of(values), rest, notes


def truth(key: str, value: str) -> bool:
    if value.lower() in TRUE + FALSE:
        return value.lower() in TRUE
    raise ConfigError(f"{key}={value!r} is not true or false (it is deprecated: pass --rehearse instead)")


def settings_of(values: dict[str, Any]) -> RehearsalSettings:
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        if name == "dir":
            parsed[name] = value or None
            continue
        try:
            parsed[name] = float(value)
        except ValueError:
            parsed[name] = -1.0
        if parsed[name] < 0:
            flag = "--rehearsal-" + name.replace("_", "-")
            raise ConfigError(f"{flag}={value!r} must be a number of seconds >= 0")
    return RehearsalSettings(**parsed)


@dataclass(frozen=True)
class StandInConnection:
    """What the Jobs executor talks to while the stand-in runs (the launcher's `Connection`)."""

    api: Any
    namespace: str
    token: str
    reach: Any
    replay: list[str]  # how `agrpo pull` / `agrpo jobs` find this run again: the stand-in replayed from its folder
    placeholders: dict[str, str]
    outcome: dict[str, Any]


class RehearsalHub:
    """The Hub backend of a rehearsal: every Job a process group on this machine, the bucket a folder, the Hub API a
    local server (agrpo/rehearsal; docs/hf_jobs.md, "Rehearse first"). Needs root (mount and network namespaces)."""

    jobs_on_this_machine = True  # the replicas serve on this machine's device, whatever their flavor; nothing billed
    asked_by = SWITCH
    detail_loggers = ("agrpo.rehearsal",)

    def __init__(self, settings: RehearsalSettings | None = None):
        self.settings = settings or RehearsalSettings()

    def replica_url(self, configured: str) -> str:
        return REPLICA_URL

    def plan_lines(self) -> list[str]:
        where = self.settings.dir or "a fresh temporary folder"
        return [
            f"rehearse (--rehearse): every Job below runs on this machine against a local stand-in of the Jobs and "
            f"Buckets API (listing lag {self.settings.listing_lag_s:g} s, negative lookup cache "
            f"{self.settings.negative_cache_s:g} s) in {where}; {GATEWAY_PLACEHOLDER} is the stand-in's gateway "
            "port, chosen at start"
        ]

    @contextlib.contextmanager
    def connect(self, namespace: str | None, prices: dict[str, float]) -> Iterator[StandInConnection]:
        """The stand-in, running while the block runs; every Job ended when it returns."""
        from agrpo.rehearsal.rehearse import rehearsal

        namespace = namespace or REHEARSAL_NAMESPACE
        s = self.settings
        with rehearsal(namespace, s.listing_lag_s, s.negative_cache_s, s.dir, prices=prices) as stand_in:
            root = str(stand_in.stand_in.root)
            try:
                yield StandInConnection(
                    api=stand_in.api(),
                    namespace=namespace,
                    token=stand_in.token,
                    reach=stand_in.reach,
                    replay=["--rehearsal-dir", root],
                    placeholders={GATEWAY_PLACEHOLDER: stand_in.gateway_port},
                    outcome={"rehearsal_dir": root},
                )
            finally:
                print(f"agrpo: the rehearsal's Jobs (jobs.json, jobs/<id>/log.txt) and bucket stay in {root}")


@contextlib.contextmanager
def replayed(folder: str, prices: dict[str, float]) -> Iterator[tuple[Any, str]]:
    """(api, namespace) of a finished rehearsal, replayed from its folder, for `agrpo pull` and `agrpo jobs`."""
    from agrpo.rehearsal.rehearse import replay

    with replay(folder, prices=prices) as stand_in:
        yield stand_in.api(), stand_in.namespace
