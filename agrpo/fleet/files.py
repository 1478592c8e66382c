"""What the trainer and the launcher's fleet controller exchange through the run dir (inference.replicas=auto):
the trainer appends one JSON line per step with the signals the policy reads (`steps.jsonl`); the controller writes
the fleet's size and replica-seconds (`state.json`), which the trainer logs as `fleet/*` (TensorBoard,
log_history).

Both are read through agrpo/interprocess.py: a bad step line (not an object, not JSON, NaN, a string where a number
goes) is skipped and counted, never handed on; a bad state.json reads as none.

A shared fleet (`agrpo fleet up NAME ... inference.replicas=auto`) finds its tenants' step files through one record
per attached run, `<runtime dir>/fleets/NAME/tenants/<TENANT>.json` = {"tenant", "run_dir"} (0600, written
atomically by the attaching launcher at registration, removed at its teardown: `write_tenant`, `remove_tenant`);
`TenantSteps` reads every current tenant's steps.jsonl, each line tagged with its tenant (signals.combine_tenants).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agrpo.fleet.signals import TENANT, gate_deltas, with_gate_waits
from agrpo.fleet.tenancy import TENANT_RE
from agrpo.interprocess import SKIPPED, BadInput, Skipped, digits, integer, mapping, number, numbers, parse_lines
from agrpo.interprocess import MAX_INPUT_BYTES, parse_record, read_record, record, text
from agrpo.processes.private_dir import open_runtime_dir

FLEET_DIR = "fleet"
STEPS_FILE = "steps.jsonl"
STATE_FILE = "state.json"
REPLICAS, REPLICA_SECONDS = "fleet/replicas", "fleet/replica_seconds"


def steps_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STEPS_FILE


def state_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FLEET_DIR / STATE_FILE


STATE_RECORD = record(
    {
        "replicas": integer,
        "replica_seconds": number,
        "seconds_by_size": mapping(number, key=digits),
        "max_replicas": integer,
        "samples": integer,
        "lost": integer,
        "replaced": integer,
        "skipped": integer,
    }
)


def append_step(run_dir: str | Path, entry: dict[str, Any]) -> None:
    """One line; a figure that is not a finite number is left out (the reader would reject the line)."""
    path = steps_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    finite = {k: v for k, v in entry.items() if type(v) in (int, float) and math.isfinite(v)}  # not bool, NaN
    with path.open("a") as out:
        out.write(json.dumps(finite) + "\n")


def write_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path = state_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def read_state(run_dir: str | Path, skipped: Skipped = SKIPPED) -> dict[str, Any]:
    """The state the controller last wrote, its fields typed ({} when there is none; a bad one is counted)."""
    return read_record(state_path(run_dir), STATE_RECORD, skipped, default={})


def fleet_figures(run_dir: str | Path) -> dict[str, float]:
    """`fleet/replicas` and `fleet/replica_seconds` as the controller last wrote them ({} before it wrote any)."""
    state = read_state(run_dir)
    if "replicas" not in state or "replica_seconds" not in state:
        return {}
    return {REPLICAS: float(state["replicas"]), REPLICA_SECONDS: state["replica_seconds"]}


class StepReader:
    """The step entries appended since the last read (a partial last line waits for the next read), each an object
    of non-negative finite numbers; every other line is skipped and counted in `skipped`."""

    def __init__(self, run_dir: str | Path, skipped: Skipped | None = None):
        self.path = steps_path(run_dir)
        self.offset = 0
        self.lines = 0  # complete lines read so far (to name a bad one's number)
        self.skipped = skipped if skipped is not None else Skipped()

    def read(self) -> list[dict[str, float]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        entries = parse_lines(complete[:-1], numbers, STEPS_FILE, self.skipped, first_line=self.lines + 1)
        self.lines += complete.count(b"\n")
        return entries


# ---------------------------------------------------------------------------- a shared fleet's tenants
TENANTS = "tenants"
TENANT_RECORD = record({"tenant": text, "run_dir": text}, required=("tenant", "run_dir"))
_FILE_MODE = 0o600


def _tenants_fd(fleet: str) -> int:
    """The fleet's private tenants directory (agrpo/processes/private_dir.py: 0700, owner checked, no link)."""
    return open_runtime_dir("fleets", fleet, TENANTS)


def write_tenant(fleet: str, tenant: str, run_dir: str | Path) -> None:
    """The record that tells fleet `fleet`'s controller where `tenant` writes its steps (0600, tmp + rename)."""
    if not TENANT_RE.fullmatch(tenant):
        raise ValueError(f"not a tenant id: {tenant!r}")
    fd = _tenants_fd(fleet)
    partial = f".{tenant}.{os.getpid()}.tmp"
    try:
        file_fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _FILE_MODE, dir_fd=fd)
        with os.fdopen(file_fd, "w") as out:
            os.fchmod(out.fileno(), _FILE_MODE)  # whatever the umask
            out.write(json.dumps({"tenant": tenant, "run_dir": str(Path(run_dir).resolve())}))
        os.rename(partial, f"{tenant}.json", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def remove_tenant(fleet: str, tenant: str) -> None:
    if not TENANT_RE.fullmatch(tenant):
        return
    fd = _tenants_fd(fleet)
    try:
        os.unlink(f"{tenant}.json", dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def clear_tenants(fleet: str) -> None:
    """A fleet starting has no tenant yet: records a killed run left behind are removed."""
    fd = _tenants_fd(fleet)
    try:
        for name in os.listdir(fd):
            if name.endswith((".json", ".tmp")):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def _read_tenant(fd: int, name: str, skipped: Skipped) -> str | None:
    """The run dir of one record, or None (counted) when it is not a plain file of ours holding a good record."""
    try:
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as error:
        skipped.skip(TENANTS, f"{name}: {error.strerror}")
        return None
    with os.fdopen(file_fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        try:
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise BadInput("not a plain file of this user's")
            found = parse_record(handle.read(MAX_INPUT_BYTES + 1), TENANT_RECORD)
            if found["tenant"] != name[: -len(".json")]:
                raise BadInput(f"it names tenant {found['tenant']!r}")
        except BadInput as error:
            skipped.skip(TENANTS, f"{name}: {error}")
            return None
    return found["run_dir"]


def read_tenants(fleet: str, skipped: Skipped = SKIPPED) -> dict[str, str]:
    """{tenant: run dir} of every run attached to fleet `fleet` now (a bad record is skipped and counted)."""
    fd = _tenants_fd(fleet)
    try:
        names = sorted(n for n in os.listdir(fd) if n.endswith(".json") and TENANT_RE.fullmatch(n[: -len(".json")]))
        found = {name[: -len(".json")]: _read_tenant(fd, name, skipped) for name in names}
    finally:
        os.close(fd)
    return {tenant: run_dir for tenant, run_dir in found.items() if run_dir is not None}


class TenantSteps:
    """StepReader's interface for a shared fleet: the step entries every current tenant appended since the last
    read, each tagged with its tenant (signals.TENANT). `tenants` is the set attached at the last read; a tenant that
    left is forgotten. Lines already in a tenant's file when its record is first seen are not counted. `gate`, when
    set (agrpo fleet up: its TenantLedger's reading of the proxy), gives each tenant's running total of seconds waited
    at the fair-share gate; what a tenant waited since the last read goes on its newest step (signals.GATE_WAIT_S)."""

    def __init__(self, fleet: str, skipped: Skipped | None = None, gate: Callable[[], dict[str, float]] | None = None):
        self.fleet = fleet
        self.skipped = skipped if skipped is not None else Skipped()
        self.readers: dict[str, StepReader] = {}
        self.run_dirs: dict[str, str] = {}
        self.gate = gate
        self.gate_seen: dict[str, float] = {}  # the proxy's totals at the last read
        self.gate_owed: dict[str, float] = {}  # seconds waited that no step of the tenant carries yet

    @property
    def tenants(self) -> set[str]:
        return set(self.readers)

    def read(self) -> list[dict[str, Any]]:
        try:
            current = read_tenants(self.fleet, self.skipped)
        except Exception as error:  # the directory cannot be opened (LaunchError: refused): no tenant this poll
            self.skipped.skip(TENANTS, str(error))
            current = {}
        for tenant in [t for t in self.readers if self.run_dirs.get(t) != current.get(t)]:
            del self.readers[tenant], self.run_dirs[tenant]
        entries: list[dict[str, Any]] = []
        for tenant, run_dir in current.items():
            if tenant not in self.readers:  # its record is written before its trainer starts: earlier lines are
                self.readers[tenant], self.run_dirs[tenant] = StepReader(run_dir, self.skipped), run_dir
                self.readers[tenant].read()  # an earlier attempt's (a resumed run's dir), as StepReader's are
            entries += [{**entry, TENANT: tenant} for entry in self.readers[tenant].read()]
        return self._with_gate(entries)

    def _with_gate(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.gate is None:
            return entries
        try:
            totals = {tenant: float(total) for tenant, total in self.gate().items() if tenant in self.readers}
        except Exception as error:  # the ledger's reading is the proxy's typed answer; whatever else: no gate now
            self.skipped.skip("gate_wait_s", str(error))
            return entries
        for tenant, waited in gate_deltas(totals, self.gate_seen).items():
            self.gate_owed[tenant] = self.gate_owed.get(tenant, 0.0) + waited
        for tenant in [t for t in self.gate_owed if t not in self.readers]:
            del self.gate_owed[tenant]
        return with_gate_waits(entries, self.gate_owed)
