"""`agrpo fleet status [NAME]` and `agrpo fleet down NAME`: what the running fleets serve, and stopping one.

Both read the fleets' records (registry.py). Status asks each fleet's proxy for its tenants (`GET /fleet/tenants`
with the fleet's admin token, typed at agrpo/interprocess.py's boundary) and removes the records of fleets whose
process is gone. Down sends SIGTERM to the fleet's process (its process group when it leads one: a fleet started from a
shell does, one started by another program as a plain child does not, and that program's group is not ours to signal)
and waits until it is gone: the fleet stops its replicas, proxy and controller itself and removes its record.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from agrpo.errors import ConfigError
from agrpo.fleet.registry import FleetRecord, list_fleets, load_fleet, read_fleet, remove_fleet, shown_path
from agrpo.interprocess import BadInput, array, integer, number, parse_record, record, text

DOWN_WAIT_S = 30.0
TENANT_ENTRY = record(
    {
        "tenant": text,
        "run": text,
        "adapters": array(text),
        "in_flight": number,
        "requests": number,
        "tokens": number,
        "replica_seconds": number,
        "gate_wait_s": number,
        "registered_at": number,
        "lease_expires_in_s": number,
    },
    required=("tenant",),
)
TENANTS_ANSWER = record(
    {"tenants": array(TENANT_ENTRY), "replica_seconds": number, "replicas": integer, "idle_replica_seconds": number}
)


def fleet_tenants(url: str, admin_token: str, timeout_s: float = 5.0) -> tuple[dict[str, Any] | None, str]:
    """(the proxy's typed `GET /fleet/tenants` answer, '') or (None, why there is none)."""
    request = urllib.request.Request(f"{url}/fleet/tenants", headers={"Authorization": f"Bearer {admin_token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the fleet's own loopback URL
            body = response.read()
    except urllib.error.HTTPError as error:
        return None, f"its proxy answered HTTP {error.code} to GET /fleet/tenants"
    except (urllib.error.URLError, OSError) as error:
        return None, f"its proxy does not answer ({getattr(error, 'reason', error)})"
    try:
        return parse_record(body, TENANTS_ANSWER), ""
    except BadInput as error:
        return None, f"its proxy's GET /fleet/tenants answer cannot be read ({error})"


def duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h {rest // 60}m" if hours else f"{rest // 60}m {rest % 60}s"


def tenant_line(entry: dict[str, Any], total_s: float) -> str:
    """One tenant as status shows it (pure)."""
    adapters = entry.get("adapters", [])
    shown = ", ".join(adapters[:3]) + (f", +{len(adapters) - 3}" if len(adapters) > 3 else "")
    seconds = entry.get("replica_seconds", 0.0)
    share = f" ({seconds / total_s:.0%})" if total_s > 0 else ""
    return (
        f"  {entry['tenant']} (run {entry.get('run', '?')}): {len(adapters)} adapter(s)"
        + (f" [{shown}]" if adapters else "")
        + f", {entry.get('in_flight', 0):.0f} in flight, {entry.get('requests', 0):.0f} requests, "
        f"{entry.get('tokens', 0):,.0f} tokens, {seconds:.0f} replica-s{share}, "
        f"lease {entry.get('lease_expires_in_s', 0):.0f} s"
    )


def render_fleet(fleet: FleetRecord, answer: dict[str, Any] | None, problem: str, now: float) -> list[str]:
    """The lines of one running fleet (pure): the record, then its tenants as its proxy counts them."""
    tenants = (answer or {}).get("tenants", [])
    head = (
        f"fleet {fleet.name}: {fleet.url}, pid {fleet.pid}, up {duration(now - fleet.started_at)}, model {fleet.model} "
        f"(max_model_len {fleet.max_model_len}, LoRA rank <= {fleet.max_lora_rank}), "
        f"{len(tenants) if answer else '?'}/{fleet.max_tenants} tenants; run dir {fleet.run_dir}"
    )
    if answer is None:
        return [head, f"  {problem}"]
    total = answer.get("replica_seconds", 0.0)
    lines = [
        head,
        f"  {answer.get('replicas', 0)} replica(s), {total:.0f} replica-seconds "
        f"({answer.get('idle_replica_seconds', 0.0):.0f} idle)",
    ]
    lines += [tenant_line(entry, total) for entry in tenants] or ["  no tenant attached"]
    return lines


def status(name: str | None = None, now: float | None = None) -> tuple[list[str], int]:
    """(lines, exit code) of `agrpo fleet status [NAME]`; stale records are reported and removed."""
    now = time.time() if now is None else now
    running, stale, bad = list_fleets()
    if name is not None:
        running = [read_fleet(name)]  # ConfigError (exit 2) when it does not run: stale removed first, below
    lines = []
    for fleet in stale:
        if name is None or fleet.name == name:
            remove_fleet(fleet.name, pid=fleet.pid)
            lines.append(f"fleet {fleet.name}: not running (its process {fleet.pid} is gone); removed its stale record")
    lines += [f"fleet {bad_name}: {paragraph}" for bad_name, paragraph in bad.items() if name in (None, bad_name)]
    for fleet in running:
        answer, problem = fleet_tenants(fleet.url, fleet.admin_token)
        lines += render_fleet(fleet, answer, problem, now)
    if not lines:
        lines = ["no fleet is running (start one with `agrpo fleet up [NAME] +recipe=NAME`)"]
    return lines, 0


def status_main(name: str | None) -> int:
    try:
        lines, code = status(name)
    except ConfigError as error:
        stale = getattr(error, "fleet", None)
        if stale is not None:
            remove_fleet(stale.name, pid=stale.pid)
        print(f"agrpo fleet status: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    print("\n".join(lines), flush=True)
    return code


def signal_fleet(fleet: FleetRecord, signum: int = signal.SIGTERM) -> None:
    """SIGTERM the fleet: its process group when it leads one, else its process alone."""
    try:
        if fleet.pgid == fleet.pid:
            os.killpg(fleet.pgid, signum)
        else:
            os.kill(fleet.pid, signum)
    except ProcessLookupError:
        pass


def wait_gone(fleet: FleetRecord, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while fleet.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def down(name: str, timeout_s: float = DOWN_WAIT_S) -> tuple[str, int]:
    """(the line to print, exit code) of `agrpo fleet down NAME`."""
    try:
        fleet = load_fleet(name)
    except ConfigError as error:
        removed = remove_fleet(name)
        return f"{error} ({'removed it' if removed else 'nothing to remove'})", 1
    if fleet is None:
        read_fleet(name)  # the paragraph naming the fleets that run
    assert fleet is not None
    if fleet.uid != os.geteuid():
        return f"the record {shown_path(name)} names uid {fleet.uid}, not you: not signalling its process", 1
    if not fleet.alive():
        remove_fleet(name, pid=fleet.pid)
        return f"fleet {name} was not running (its process {fleet.pid} is gone); removed its record", 0
    started = time.monotonic()
    signal_fleet(fleet)
    if not wait_gone(fleet, timeout_s):
        return (
            f"fleet {name} (pid {fleet.pid}) is still stopping after {timeout_s:.0f} s: it stops its replicas within "
            f"launcher.stop_timeout_s; `agrpo fleet status` shows when it is gone",
            1,
        )
    remove_fleet(name, pid=fleet.pid)  # its own exit removed it, unless it was killed
    return f"fleet {name} stopped ({time.monotonic() - started:.1f} s)", 0


def down_main(name: str) -> int:
    try:
        line, code = down(name)
    except ConfigError as error:
        print(f"agrpo fleet down: error: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    print(line, flush=True)
    return code
