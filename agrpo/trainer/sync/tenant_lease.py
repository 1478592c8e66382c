"""The trainer as a tenant of a shared fleet (issue 43): who it is, its lease, and its share of the fleet at the end.

The launcher registers the run with the fleet (`POST /fleet/tenants`) before the trainer starts and hands it the
tenant id in AGRPO_TENANT, the tenant's token in AGRPO_PROXY_ADMIN_TOKEN (sent as a bearer token on every request) and
the lease in AGRPO_TENANT_LEASE_S. Why a lease: a trainer that dies (SIGKILL, OOM, a lost machine) cannot unregister,
so the fleet forgets a tenant whose lease lapsed and unloads its adapters (bound: lease + 1 s + the unloads;
docs/shared_fleet.md). The trainer keeps it alive from a daemon thread, renewing every lease/4 s, so three renewals in
a row may fail before it lapses. A fleet that answers 404 has forgotten the run (lapsed lease, restarted fleet): the
run ends with one paragraph, since every later load and request of its namespace would be refused.

`fleet_share` and `share_line` are pure; `LeaseRenewer` is the thread, its HTTP call injected.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agrpo.errors import AgrpoError, ConfigError
from agrpo.fleet.tenancy import tenant_api_call, tenant_of

log = logging.getLogger(__name__)

TENANT_ENV = "AGRPO_TENANT"
LEASE_ENV = "AGRPO_TENANT_LEASE_S"
DEFAULT_LEASE_S = 20.0  # the fleet's default lease (inference.shared.lease_s)
RENEWALS_PER_LEASE = 4
GONE_SIGNAL = signal.SIGUSR2  # the renewal thread interrupts the trainer's main thread with it (the child uses USR1)


class TenantGone(AgrpoError):
    """The fleet no longer knows this run: its lease lapsed or the fleet restarted."""


class _Interrupted(BaseException):
    """Raised in the main thread by GONE_SIGNAL's handler; a BaseException so that no `except Exception` on the way
    (TRL's, transformers') swallows it. `ending_when_gone` turns it into TenantGone."""


@dataclass(frozen=True)
class Tenancy:
    """This run on a shared fleet: its tenant id, lease and token, and the fleet's base URL (its proxy)."""

    tenant: str
    lease_s: float
    token: str
    url: str

    @property
    def renew_every_s(self) -> float:
        return self.lease_s / RENEWALS_PER_LEASE


def tenancy_from_env(env: Mapping[str, str], url: str) -> Tenancy | None:
    """The run's tenancy as the launcher passed it (None: not on a shared fleet). A bad value is a ConfigError."""
    from agrpo.proxy.settings import ADMIN_TOKEN_ENV

    tenant = env.get(TENANT_ENV) or None
    if tenant is None:
        return None
    if tenant_of(f"{tenant}/x") != tenant:
        raise ConfigError(f"{TENANT_ENV}={tenant!r} is not a tenant id the fleet gives (t<k>-<run slug>)")
    raw = env.get(LEASE_ENV) or str(DEFAULT_LEASE_S)
    try:
        lease_s = float(raw)
    except ValueError:
        lease_s = math.nan
    if not math.isfinite(lease_s) or lease_s <= 0:
        raise ConfigError(f"{LEASE_ENV}={raw!r} is not a lease in seconds (a positive number, e.g. 20)")
    token = env.get(ADMIN_TOKEN_ENV) or ""
    if not token:
        raise ConfigError(f"{TENANT_ENV} is set but {ADMIN_TOKEN_ENV} (the tenant's token) is not")
    return Tenancy(tenant, lease_s, token, url.rstrip("/"))


def fleet_call(tenancy: Tenancy, method: str, path: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of one call to the fleet's tenant API with the tenant's token. OSError when the fleet
    cannot be reached."""
    body = {} if method == "POST" else None
    status, raw = tenant_api_call(f"{tenancy.url}{path}", method, tenancy.token, body, timeout_s)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    return status, body if isinstance(body, dict) else {}


def gone_message(tenancy: Tenancy, fleet: str | None, why: str) -> str:
    where = f"the shared fleet {fleet}" if fleet else f"the shared fleet at {tenancy.url}"
    return (
        f"{where} no longer knows this run (tenant {tenancy.tenant}: {why}): a fleet forgets a run whose lease "
        f"({tenancy.lease_s:g} s, renewed every {tenancy.renew_every_s:g} s) lapsed, or that it did not register "
        "because it was restarted, and unloads its adapters. The run stopped; its checkpoints and adapters are kept, "
        "so it can go on with trainer.resume=auto once the fleet runs (agrpo fleet status)"
    )


class LeaseRenewer:
    """Renews the lease every lease/4 s on a daemon thread. A failed renewal is logged once (until one succeeds
    again); a 404 calls `on_gone(paragraph)` once and ends the thread."""

    def __init__(
        self,
        tenancy: Tenancy,
        on_gone: Callable[[str], None],
        fleet: str | None = None,
        call: Callable[..., tuple[int, dict[str, Any]]] = fleet_call,
    ):
        self.tenancy, self.on_gone, self.fleet, self._call = tenancy, on_gone, fleet, call
        self.renewals = 0
        self.failures = 0
        self.gone: str | None = None
        self._failing = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="agrpo-tenant-lease", daemon=True)

    def start(self) -> "LeaseRenewer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def renew_once(self) -> bool:
        """One renewal; False once the fleet said the tenant is gone."""
        path = f"/fleet/tenants/{self.tenancy.tenant}/lease"
        try:
            status, body = self._call(self.tenancy, "POST", path, self.tenancy.renew_every_s)
        except OSError as error:
            status, body = None, {"message": str(error)}
        if status == 200:
            if self._failing:
                log.info("lease of tenant %s renewed again", self.tenancy.tenant)
            self._failing = False
            self.renewals += 1
            return True
        if status == 404:
            self.gone = gone_message(self.tenancy, self.fleet, "HTTP 404 on its lease renewal")
            log.error("%s", self.gone)
            self.on_gone(self.gone)
            return False
        self.failures += 1
        if not self._failing:  # once per spell of failures: trainer.log, not a line per renewal
            what = f"HTTP {status}" if status is not None else "no answer"
            detail = str(body.get("message") or body.get("detail") or "")[:300]
            log.warning(
                "could not renew the lease of tenant %s at %s (%s%s); the fleet drops the run if it lapses (%g s)",
                self.tenancy.tenant,
                self.tenancy.url,
                what,
                f": {detail}" if detail else "",
                self.tenancy.lease_s,
            )
        self._failing = True
        return True

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.tenancy.renew_every_s):
            if not self.renew_once():
                return


def interrupt_main(_message: str) -> None:
    """Wake the trainer's main thread, even inside a blocking call: its GONE_SIGNAL handler raises there."""
    signal.pthread_kill(threading.main_thread().ident, GONE_SIGNAL)


def _raise_interrupted(_signum: int, _frame: Any) -> None:
    raise _Interrupted()


@contextlib.contextmanager
def ending_when_gone(renewer: LeaseRenewer) -> Iterator[LeaseRenewer]:
    """Run the body (training, in the main thread) with the lease renewed; when the fleet forgets the run, the body
    is interrupted and TenantGone raised with the renewer's paragraph."""
    previous = signal.signal(GONE_SIGNAL, _raise_interrupted)
    renewer.start()
    try:
        yield renewer
    except _Interrupted:
        raise TenantGone(renewer.gone or gone_message(renewer.tenancy, renewer.fleet, "it was unregistered")) from None
    finally:
        renewer.stop()
        signal.signal(GONE_SIGNAL, previous)


# ---- the run's share, at the end ---------------------------------------------------------------------------------


def fleet_share(fleet: str | None, answer: Mapping[str, Any], own: Mapping[str, Any] | None = None) -> dict | None:
    """metrics.json's `shared_fleet` from `GET /fleet/tenants/<id>`: the tenant's entry plus the fleet's totals, either
    under `fleet` or merged at the top (then the top `replica_seconds` is the fleet's, as `idle_replica_seconds` beside
    it shows, and the run's own comes from `own`, its row of /proxy/stats' `tenants`). None without figures."""
    if isinstance(answer.get("fleet"), Mapping):
        total, mine = _number(answer["fleet"].get("replica_seconds")), _number(answer.get("replica_seconds"))
    elif "idle_replica_seconds" in answer:  # the totals merged over the entry
        total, mine = _number(answer.get("replica_seconds")), _number((own or {}).get("replica_seconds"))
    else:
        total, mine = _number(answer.get("fleet_replica_seconds")), _number(answer.get("replica_seconds"))
    tokens = _number(answer.get("tokens"))
    if mine is None and tokens is None:
        return None
    share = (mine / total) if (mine is not None and total) else None
    return {
        "fleet": fleet,
        "tenant": answer.get("tenant"),
        "tokens": int(tokens or 0),
        "replica_seconds_share": mine,
        "fleet_replica_seconds": total,
        "share_of_fleet": share,
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def share_line(section: Mapping[str, Any], price_per_hour: float = 0.0) -> str:
    """`fleet NAME: this run's share NN% of R replica-seconds (T tokens)`, with `, ~$X` when a price is set."""
    share, total = section.get("share_of_fleet"), section.get("fleet_replica_seconds")
    mine = section.get("replica_seconds_share") or 0.0
    shown = f"{share:.0%}" if share is not None else "?"
    line = f"fleet {section.get('fleet') or '?'}: this run's share {shown} of {total or 0:.0f} replica-seconds"
    line += f" ({int(section.get('tokens') or 0):,} tokens)"
    if price_per_hour:
        line += f", ~${mine * price_per_hour / 3600:.2f}"
    return line


def leased(tenancy: Tenancy | None, fleet: str | None) -> contextlib.AbstractContextManager:
    """The run's whole life on a shared fleet (model load included: the lease runs from registration): the lease
    renewed, and the run ended with one paragraph when the fleet forgets it. Nothing without a tenancy."""
    if tenancy is None:
        return contextlib.nullcontext()
    log.info(
        "tenant %s of %s: lease %g s, renewed every %g s",
        tenancy.tenant,
        fleet or tenancy.url,
        tenancy.lease_s,
        tenancy.renew_every_s,
    )
    return ending_when_gone(LeaseRenewer(tenancy, interrupt_main, fleet))


def read_share(tenancy: Tenancy, fleet: str | None, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """metrics.json's `shared_fleet`, read from the fleet at the end of the run (None, logged, when it cannot be)."""
    try:
        status, body = fleet_call(tenancy, "GET", f"/fleet/tenants/{tenancy.tenant}", timeout_s)
    except OSError as error:
        status, body = None, {"message": str(error)}
    own = own_row(tenancy, timeout_s) if status == 200 and not isinstance(body.get("fleet"), Mapping) else None
    section = fleet_share(fleet, body, own) if status == 200 else None
    if section is None:
        log.warning(
            "the fleet's figures for tenant %s could not be read (HTTP %s: %s); metrics.json has no "
            "shared_fleet section",
            tenancy.tenant,
            status,
            str(body.get("message") or "")[:200],
        )
    return section


def own_row(tenancy: Tenancy, timeout_s: float) -> dict[str, Any] | None:
    """This tenant's row of the proxy's /proxy/stats `tenants` (its replica-seconds), or None."""
    try:
        status, body = fleet_call(tenancy, "GET", "/proxy/stats", timeout_s)
    except OSError:
        return None
    rows = body.get("tenants") if status == 200 else None
    return next((r for r in rows or [] if isinstance(r, dict) and r.get("tenant") == tenancy.tenant), None)
