"""Where a running shared fleet is found: one record per fleet, `<runtime dir>/fleets/<NAME>.json` (issue 43).

`agrpo fleet up` writes its record once the fleet is ready and removes it when it stops; runs that attach
(`inference.shared_fleet=NAME`), `agrpo fleet status` and `agrpo fleet down` read it. The record holds the fleet's
admin token, so it lives in this user's private runtime directory (agrpo/processes/private_dir.py: 0700, owner
checked, no link followed) as a 0600 file written atomically (a temporary file, then a rename), never on a command
line. It is parsed at one guarded boundary (agrpo/interprocess.py): a bad file is one paragraph, never a traceback.
A record whose process is gone (a fleet that was SIGKILLed) is stale: `read_fleet` refuses it, `list_fleets` reports
it apart, `agrpo fleet status` removes it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from agrpo.errors import ConfigError
from agrpo.fleet.tenancy import valid_fleet_name
from agrpo.interprocess import MAX_INPUT_BYTES, BadInput, integer, number, parse_record, record, text
from agrpo.processes.private_dir import open_runtime_dir, runtime_base
from agrpo.processes.watchdog import proc_stat

FLEETS = "fleets"  # the runtime directory's subfolder
FILE_MODE = 0o600
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class FleetRecord:
    """What a fleet tells the runs that attach to it (docs/shared_fleet.md, "Where a fleet's record lives")."""

    name: str
    url: str  # the proxy's base URL, http://127.0.0.1:PORT
    admin_token: str
    model: str  # the resolved model path or Hub id the replicas serve
    max_model_len: int
    max_lora_rank: int
    max_tenants: int
    versions_per_tenant: int
    pid: int  # the `agrpo fleet up` process
    pgid: int
    started_at: float  # unix seconds
    run_dir: str  # the fleet's own folder: logs, fleet/state.json, fleet_summary.json
    uid: int
    pid_start: int | None = None  # the fleet process's start time (clock ticks): tells it from a later process

    def alive(self) -> bool:
        """Whether the fleet's process still runs (the same process: a reused pid with another start time is not;
        an exited one its parent has not reaped yet, a zombie, is not either)."""
        found = proc_stat(self.pid)
        if found is None or found[0] in ("Z", "X"):
            return False
        return self.pid_start is None or found[3] == self.pid_start


REQUIRED = tuple(name for name in FleetRecord.__dataclass_fields__ if name != "pid_start")
FLEET_RECORD = record(
    {
        "name": text,
        "url": text,
        "admin_token": text,
        "model": text,
        "max_model_len": integer,
        "max_lora_rank": integer,
        "max_tenants": integer,
        "versions_per_tenant": integer,
        "pid": integer,
        "pgid": integer,
        "started_at": number,
        "run_dir": text,
        "uid": integer,
        "pid_start": integer,
    },
    required=REQUIRED,
)


def model_identity(name_or_path: str) -> str:
    """A model as fleets and runs compare it: a local folder by its real path, a Hub id as it is written."""
    path = Path(name_or_path).expanduser()
    return str(path.resolve()) if path.is_absolute() or path.exists() else name_or_path


class StaleFleet(ConfigError):
    """The record names a process that is gone."""

    def __init__(self, message: str, fleet: FleetRecord):
        super().__init__(message)
        self.fleet = fleet


def shown_path(name: str) -> str:
    return str(runtime_base() / FLEETS / f"{name}.json")


def parse_fleet(data: bytes, name: str) -> FleetRecord:
    """The typed record of `name` from its file's bytes, or ConfigError with one paragraph (pure)."""
    try:
        fields = parse_record(data, FLEET_RECORD)
        if fields["name"] != name:
            raise BadInput(f"it names fleet {fields['name']!r}, not {name!r}")
        if not fields["url"].startswith(("http://", "https://")):
            raise BadInput(f"url {fields['url'][:80]!r} is no http(s) URL")
    except BadInput as error:
        raise ConfigError(
            f"the record of fleet {name!r} ({shown_path(name)}) cannot be read: {error}. Runs cannot attach to a "
            f"fleet whose address and token are unknown; `agrpo fleet down {name}` removes the record (stop the "
            f"fleet's process yourself if it still runs), then `agrpo fleet up {name} +recipe=...` starts it again"
        ) from None
    return FleetRecord(**fields)


def _name_problem(name: str) -> None:
    problem = valid_fleet_name(name)
    if problem:
        raise ConfigError(problem)


def _read_bytes(name: str) -> bytes | None:
    """The file's bytes (None: no such fleet), read through the checked directory without following a link."""
    fd = open_runtime_dir(FLEETS)
    try:
        try:
            file_fd = os.open(f"{name}.json", READ_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ConfigError(
                f"the record of fleet {name!r} ({shown_path(name)}) cannot be opened ({error.strerror}): it must be "
                f"a plain file of yours; remove it with `agrpo fleet down {name}`"
            ) from None
        with os.fdopen(file_fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise ConfigError(
                    f"{shown_path(name)} is not a plain file of yours: agrpo reads a fleet's address and token only "
                    f"from the record `agrpo fleet up` wrote; remove it with `agrpo fleet down {name}`"
                )
            return handle.read(MAX_INPUT_BYTES + 1)
    finally:
        os.close(fd)


def load_fleet(name: str) -> FleetRecord | None:
    """The record of fleet `name` as written, stale or not; None when there is none. ConfigError when bad."""
    _name_problem(name)
    data = _read_bytes(name)
    return None if data is None else parse_fleet(data, name)


def read_fleet(name: str) -> FleetRecord:
    """The record of the running fleet `name`, or ConfigError (exit 2) with one paragraph: none, unreadable, or
    stale (its process is gone: StaleFleet)."""
    fleet = load_fleet(name)
    if fleet is None:
        running = ", ".join(fleet_names()) or "none"
        raise ConfigError(
            f"no fleet named {name!r} is running for this user (no {shown_path(name)}; running: {running}). Start "
            f"it with `agrpo fleet up {name} +recipe=NAME` and wait for `fleet {name} ready at URL`"
        )
    if not fleet.alive():
        raise StaleFleet(
            f"fleet {name!r} is not running: its process {fleet.pid} is gone (killed before it could remove its "
            f"record {shown_path(name)}). `agrpo fleet status` removes the record; `agrpo fleet up {name} "
            "+recipe=NAME` starts the fleet again",
            fleet,
        )
    return fleet


def hold_name(name: str) -> int:
    """An exclusive lock on fleet `name` (`fleets/.NAME.lock`, opened without following a link), held by the fleet
    process for its whole life, so that two `agrpo fleet up NAME` never both start; the kernel drops it when that
    process ends, however it ends. Returns the descriptor (keep it open); ConfigError when another process holds it."""
    import fcntl

    _name_problem(name)
    fd = open_runtime_dir(FLEETS)
    try:
        lock_fd = os.open(
            f".{name}.lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=fd
        )
    finally:
        os.close(fd)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise ConfigError(
            f"another `agrpo fleet up {name}` is starting or running (it holds {shown_path(name)[:-5]}.lock): attach "
            f"runs with inference.shared_fleet={name} once it prints `fleet {name} ready at URL`, stop it with "
            f"`agrpo fleet down {name}`, or name another fleet"
        ) from None
    return lock_fd


def fleet_names() -> list[str]:
    """The names of every record in the directory (stale or bad ones included), sorted."""
    fd = open_runtime_dir(FLEETS)
    try:
        entries = os.listdir(fd)
    finally:
        os.close(fd)
    names = [entry[: -len(".json")] for entry in entries if entry.endswith(".json")]
    return sorted(name for name in names if valid_fleet_name(name) is None)


def list_fleets() -> tuple[list[FleetRecord], list[FleetRecord], dict[str, str]]:
    """(running fleets, stale records, {name: paragraph} for records that cannot be read)."""
    running, stale, bad = [], [], {}
    for name in fleet_names():
        try:
            fleet = load_fleet(name)
        except ConfigError as error:
            bad[name] = str(error)
            continue
        if fleet is not None:
            (running if fleet.alive() else stale).append(fleet)
    return running, stale, bad


def record_bytes(fleet: FleetRecord) -> bytes:
    return (json.dumps(asdict(fleet), indent=1) + "\n").encode()


def write_fleet(fleet: FleetRecord) -> None:
    """Write `fleet`'s record atomically (0600 temporary file in the checked directory, fsync, rename)."""
    _name_problem(fleet.name)
    fd = open_runtime_dir(FLEETS)
    temporary = f".{fleet.name}.{os.getpid()}.tmp"
    try:
        file_fd = os.open(temporary, WRITE_FLAGS, FILE_MODE, dir_fd=fd)
        try:
            os.fchmod(file_fd, FILE_MODE)  # whatever the umask
            os.write(file_fd, record_bytes(fleet))
            os.fsync(file_fd)
        finally:
            os.close(file_fd)
        os.rename(temporary, f"{fleet.name}.json", src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=fd)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def remove_fleet(name: str, pid: int | None = None) -> bool:
    """Remove fleet `name`'s record; whether there was one. With `pid`, only a record that process wrote (a fleet
    stopping removes its own record, never a newer fleet's of the same name)."""
    _name_problem(name)
    if pid is not None:
        try:
            written = load_fleet(name)
        except ConfigError:
            return False
        if written is None or written.pid != pid:
            return False
    fd = open_runtime_dir(FLEETS)
    try:
        os.unlink(f"{name}.json", dir_fd=fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
