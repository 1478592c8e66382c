"""The fleet controller the local launcher runs beside the trainer (inference.replicas=auto): it reads the signals
(the trainer's step lines, the proxy's /proxy/stats, each replica's /metrics), asks the policy (policy.py), and
carries out its decision through the proxy's admin routes.

Add: the next spare replica (keyed and bound like the others, from the plan) starts, or, standing by since the run
began (inference.fleet.standby: vLLM imported, no device held), is told to serve; once it answers /health it is
handed to the proxy (POST /proxy/replicas), which replays the loaded adapters and the pause state before it admits
it, so it takes traffic only serving the current adapter version. Release: the newest replica the controller added
leaves the proxy first (DELETE /proxy/replicas: no new requests; those in flight finish through it), its process is
stopped once its vLLM queue is empty (or after inference.fleet.drain_timeout_s). A change takes effect when the
newcomer is admitted or the drained process has stopped; the policy's window restarts there, leaving out the first
inference.fleet.settle_steps steps (they began on the old fleet).

Replica Jobs (launcher=hf_jobs, agrpo/launchers/hf_jobs/fleet_jobs.py): the trainer Job runs this controller with
`new_spare` (each add launches a new replica Job from the plan's template) and `replace_lost`: a serving replica Job
that ended (preempted, failed; nothing restarts it) leaves the proxy and the count, and while the fleet is below
min_replicas it is replaced (policy.replacement: at most inference.fleet.max_replacements per run).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agrpo.fleet import files
from agrpo.fleet.cost import FleetBill, fleet_cost_lines
from agrpo.fleet.policy import ADD, HOLD, RELEASE, Decision, Knobs, Memory, Signals, decide, replacement, took_effect
from agrpo.fleet.signals import TRAINED, busy_share, latest, replica_load, window_signals
from agrpo.interprocess import PROXY_STATS, Skipped, answer_record, flag, record
from agrpo.processes.managed import http_ok

log = logging.getLogger(__name__)
_ADMIN_ANSWER = record({"healthy": flag}, keep_unknown=True)  # the proxy's answer to POST/DELETE /proxy/replicas


def http(method: str, url: str, body: dict | None = None, token: str = "", timeout_s: float = 10.0) -> bytes:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the run's own proxy and replicas
        return response.read()


@dataclass
class Pending:
    """A change under way: the replica starting or draining, and the window it was decided on."""

    decision: Decision
    replica: Any  # ManagedProcess
    basis: Signals
    since: float
    handed: bool = False  # an addition handed to the proxy


@dataclass
class FleetController:
    """Call `poll()` every second or so while the trainer runs, and `finish()` once it ended."""

    run_dir: str
    proxy_url: str
    admin_token: str
    spares: list[Any]  # ManagedProcess per spare slot, started on demand (in order)
    supervised: list[Any]  # the replicas the supervisor keeps up: added ones join, released ones leave
    started: list[Any]  # every process the launcher stops at the end
    knobs: Knobs
    poll_s: float = 2.0
    drain_timeout_s: float = 120.0
    settle_steps: int = 2  # steps after a change took effect that no window counts (inference.fleet.settle_steps)
    startup_timeout_s: float = 600.0
    inflight_ceiling: float | None = None
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    get: Callable[[str], bytes] = field(default=lambda url: http("GET", url, timeout_s=2.0))
    send: Callable[[str, str, dict, str], bytes] = field(  # admin requests: method, url, body, token
        default=lambda method, url, body, token: http(method, url, body, token, timeout_s=600.0)
    )
    healthy: Callable[[str], bool] = http_ok
    memory: Memory = field(default_factory=Memory)
    window: list[dict] = field(default_factory=list)
    busy: list[tuple[int, float]] = field(default_factory=list)  # (window steps by then, the replicas' busy share)
    # at each poll of the window: a decision averages the polls of its latest recent_steps steps
    added: list[Any] = field(default_factory=list)  # spares serving now, the newest last
    # A released local replica, drained and out of the proxy but still running until its release is judged: an undo
    # re-admits it without a boot (benchmarks/elastic.py --long: each undone release booted it again, 22-30 s)
    parked: Any | None = None
    pending: Pending | None = None
    replicas: int = 0
    seconds_by_size: dict[int, float] = field(default_factory=dict)
    changes: int = 0
    # Replica Jobs: a new spare per add (else `spares`), the serving replicas it did not start (whose end is a loss
    # too), and the replacement of lost ones below min_replicas.
    new_spare: Callable[[], Any] | None = None
    watched: list[Any] = field(default_factory=list)
    replace_lost: bool = False
    max_replacements: int = 0
    replaced: int = 0
    lost: int = 0
    samples: int = 0  # trained, from the step entries
    price_per_hour: float = 0.0  # $ per replica-hour for the end-of-run lines (0: replica-seconds only)
    price_source: str = ""
    tenants_of: str = ""  # a shared fleet's name (agrpo fleet up): its tenants' steps, combined (signals.py)
    _held: str = ""  # the last hold said below min_replicas (said once)
    _settling: int = 0  # steps still to leave out of the window after the last change

    def __post_init__(self) -> None:
        self.skipped = Skipped(logger=log)  # bad step lines, state files and proxy answers (agrpo/interprocess.py)
        shared = self.tenants_of  # a shared fleet reads its tenants' steps, tagged with each one's id
        self.reader = (
            files.TenantSteps(shared, self.skipped) if shared else files.StepReader(self.run_dir, self.skipped)
        )
        self.reader.read()  # steps already there are an earlier attempt's (a resumed run, a requeued trainer Job)
        self._carry_over(files.read_state(self.run_dir, self.skipped))
        self.replicas = len(self.watched) if self.replace_lost else self.knobs.min_replicas
        self.last_tick = self.last_poll = self.clock()
        self.last_poll -= self.poll_s
        self._write_state()

    # ------------------------------------------------------------------ accounting
    def _carry_over(self, earlier: dict) -> None:
        """An earlier attempt's figures (a requeued trainer Job, a resumed run): the run's counts go on from them."""
        for size, seconds in (earlier.get("seconds_by_size") or {}).items():
            self.seconds_by_size[size] = self.seconds_by_size.get(size, 0.0) + seconds
        self.samples += int(earlier.get("samples") or 0)
        self.lost += int(earlier.get("lost") or 0)
        self.replaced += int(earlier.get("replaced") or 0)

    def running(self) -> int:
        """Replicas that cost: those serving, one starting and one parked (a draining one still counts as serving)."""
        starting = self.pending is not None and self.pending.decision.action == ADD
        return self.replicas + int(starting) + int(self.parked is not None)

    def _tick(self) -> None:
        now, size = self.clock(), self.running()
        self.seconds_by_size[size] = self.seconds_by_size.get(size, 0.0) + (now - self.last_tick)
        self.last_tick = now

    def replica_seconds(self) -> float:
        return sum(size * seconds for size, seconds in self.seconds_by_size.items())

    def _write_state(self) -> None:
        by_size = {str(size): round(seconds, 1) for size, seconds in sorted(self.seconds_by_size.items())}
        state = {
            "replicas": self.replicas,
            "replica_seconds": self.replica_seconds(),
            "seconds_by_size": by_size,
            "max_replicas": self.knobs.max_replicas,
            "samples": self.samples,
            "lost": self.lost,
            "replaced": self.replaced,
            "skipped": self.skipped.total,
        }
        try:
            files.write_state(self.run_dir, state)
        except OSError as error:  # a full disk: the trainer's own error says so; the fleet goes on
            log.debug("fleet state not written: %s", error)

    # ------------------------------------------------------------------ the loop
    def poll(self) -> None:
        self._tick()
        entries = self.reader.read()
        self.samples += int(sum(entry.get(TRAINED, 0.0) for entry in entries))  # typed by files.StepReader
        settling, self._settling = entries[: self._settling], max(self._settling - len(entries), 0)
        self.window += entries[len(settling) :]
        if self.clock() - self.last_poll >= self.poll_s:
            self.last_poll = self.clock()
            try:
                self._step()
            except Exception as error:  # the fleet must never end the run; it holds instead
                log.warning("fleet controller: %s", error, exc_info=True)
        self._write_state()

    def _step(self) -> None:
        if self.replace_lost:
            self._check_lost()
        if self.pending is not None:
            self._advance()
            return
        signals = self._signals()
        decision = self._replacement()
        if decision is None:
            decision, self.memory = decide(signals, self.memory, self.knobs)
        if decision.verdict:
            self.say(f"agrpo fleet: {self.replicas} replica(s): {decision.reason}")
        if self.parked is not None and self.memory.judged and not decision.undo:
            self._stop_parked()  # the release was kept
        spare = self._free_spare() if decision.action == ADD else None
        if spare is not None:
            self._begin_add(decision, signals, spare)
        elif decision.action == RELEASE and self.added:
            self._begin_release(decision, signals)
        elif decision.action != HOLD:
            log.debug("fleet: %s wanted, nothing to %s with (%s)", decision.action, decision.action, decision.reason)

    def _stats(self) -> dict:
        """The proxy's /proxy/stats, typed ({} when it does not answer or answers garbage: counted)."""
        url = f"{self.proxy_url}/proxy/stats"
        try:
            body = self.get(url)
        except Exception as error:
            log.debug("proxy stats unavailable: %s", error)
            return {}
        return answer_record(body, PROXY_STATS, url, self.skipped, default={})

    def _signals(self) -> Signals:
        stats = self._stats()
        loads = []
        for replica in stats.get("replicas", []):
            try:
                loads.append(replica_load(self.get(f"{replica['url'].rstrip('/')}/metrics").decode()))
            except Exception:
                loads.append(None)
        busy = busy_share(loads)
        if busy is not None:
            self.busy.append((len(self.window), busy))  # a sample a poll: their mean is the share of the time busy
        recent = latest(self.window, self.knobs.recent_steps, getattr(self.reader, "tenants", None))  # docs/elastic.md
        first = len(self.window) - len(recent)
        samples = [share for seen, share in self.busy if seen >= first] or [share for _, share in self.busy[-1:]]
        mean_busy = sum(samples) / len(samples) if samples else None
        return window_signals(recent, self.clock(), self.replicas, self.inflight_ceiling, mean_busy)

    def _free_spare(self) -> Any:
        if self.parked is not None:
            return self.parked
        if self.new_spare is not None:
            return self.new_spare()
        return next((spare for spare in self.spares if spare not in self.added), None)

    # ------------------------------------------------------------------ lost replicas (replica Jobs)
    def _check_lost(self) -> None:
        """A serving replica whose Job ended leaves the proxy and the count (the policy's window restarts)."""
        pending = self.pending.replica if self.pending else None
        for replica in [r for r in [*self.watched, *self.added] if r is not pending and not r.alive()]:
            for group in (self.watched, self.added, self.supervised):
                if replica in group:
                    group.remove(replica)
            try:
                self._proxy("DELETE", replica)
            except Exception as error:  # the proxy already routes around it; nothing else to undo
                log.debug("fleet: removing %s from the proxy: %s", replica.name, error)
            self._tick()
            self.replicas -= 1
            self.lost += 1
            self.window, self.busy, self._settling = [], [], self.settle_steps
            self.memory = replace(self.memory, judged=True)  # the fleet now is not the one the last change made
            why = getattr(replica, "ended", lambda: "it ended")()
            self.say(f"agrpo fleet: {replica.name} lost ({why}); {self.replicas + 1} -> {self.replicas} replica(s)")

    def _replacement(self) -> Decision | None:
        """Below min_replicas after a loss: replace (within the budget) or hold, before any signal."""
        if not self.replace_lost:
            return None
        decision = replacement(self.replicas, self.knobs, self.replaced, self.max_replacements)
        if decision is None:
            self._held = ""
            return None
        if decision.action == ADD:
            self.replaced += 1
        elif decision.reason != self._held:
            self._held = decision.reason
            self.say(f"agrpo fleet: {decision.reason}")
        return decision

    # ------------------------------------------------------------------ changes
    def _begin_add(self, decision: Decision, signals: Signals, spare: Any) -> None:
        parked, self.parked = spare is self.parked, None
        if parked and not spare.alive():
            spare.stop()  # it died while parked: a fresh start
            parked = False
        standing_by = getattr(spare, "standing_by", lambda: False)()
        what = "back from parked" if parked else "starting from its standby" if standing_by else "starting"
        self.say(
            f"agrpo fleet: {self.replicas} -> {self.replicas + 1} replicas ({spare.name} {what}): {decision.reason}"
        )
        if not parked:
            if spare not in self.started:
                self.started.append(spare)  # before start: the launcher's teardown must find it
            spare.start()
        self.pending = Pending(decision, spare, signals, self.clock())

    def _stop_parked(self) -> None:
        self._tick()  # its seconds so far count as running
        replica, self.parked = self.parked, None
        replica.stop()
        self.say(f"agrpo fleet: {replica.name} stopped: the release was kept")
        self._stand_by_again(replica)

    def _stand_by_again(self, replica: Any) -> None:
        """A stopped spare stands by again (inference.fleet.standby), so that a later addition is quick too."""
        stand_by = getattr(replica, "stand_by", None)
        if stand_by is not None:
            stand_by()

    def _begin_release(self, decision: Decision, signals: Signals) -> None:
        replica = self.added[-1]
        self.say(
            f"agrpo fleet: {self.replicas} -> {self.replicas - 1} replicas ({replica.name} draining): {decision.reason}"
        )
        if replica in self.supervised:
            self.supervised.remove(replica)  # a drained replica is not restarted
        self._proxy("DELETE", replica)  # no new requests; those in flight finish through it
        self.pending = Pending(decision, replica, signals, self.clock())

    def _proxy(self, method: str, replica: Any) -> dict:
        url = replica.health_url.removesuffix("/health")
        body = self.send(method, f"{self.proxy_url}/proxy/replicas", {"url": url}, self.admin_token)
        return answer_record(body or b"{}", _ADMIN_ANSWER, f"{self.proxy_url}/proxy/replicas", self.skipped, {})

    def _advance(self) -> None:
        (self._advance_add if self.pending.decision.action == ADD else self._advance_release)(self.pending)

    def _advance_add(self, pending: Pending) -> None:
        spare, waited = pending.replica, self.clock() - pending.since
        if not spare.alive() or waited > self.startup_timeout_s:
            self.say(f"agrpo fleet: {spare.name} did not start (see {spare.log_path}); staying at {self.replicas}")
            spare.stop()
            self.memory = Memory(no_add_until=self.clock() + self.knobs.backoff_s)
            self.pending = None
            return
        if not pending.handed:
            if not self.healthy(spare.health_url):
                return
            pending.handed = True
            answer = self._proxy("POST", spare)  # the proxy replays the adapters, then admits it
            if not answer.get("healthy"):
                return  # its probes admit it once the replay succeeds
        elif not self._admitted(spare):
            return
        self.added.append(spare)
        if not self.replace_lost:  # a replica Job is not restarted: its end is a loss (_check_lost)
            self.supervised.append(spare)
        self._took_effect(pending, f"{spare.name} admitted after {waited:.0f} s")

    def _admitted(self, spare: Any) -> bool:
        url = spare.health_url.removesuffix("/health")
        replicas = self._stats().get("replicas", [])
        return any(r["url"].rstrip("/") == url and r.get("healthy") for r in replicas)

    def _advance_release(self, pending: Pending) -> None:
        replica, waited = pending.replica, self.clock() - pending.since
        try:
            waiting, running, _ = replica_load(
                self.get(replica.health_url.removesuffix("/health") + "/metrics").decode()
            )
        except Exception:
            waiting = running = 0.0  # not answering: nothing left to drain
        if waiting + running > 0 and waited < self.drain_timeout_s:
            return
        if replica in self.added:
            self.added.remove(replica)
        if not pending.decision.undo and not self.replace_lost:  # a replica Job is cancelled as before
            self._took_effect(
                pending, f"{replica.name} drained after {waited:.0f} s, parked until the release is judged"
            )
            self.parked = replica  # after _took_effect's tick: from here its seconds count beside the serving one
            return
        replica.stop()
        self._took_effect(pending, f"{replica.name} drained and stopped after {waited:.0f} s")
        self._stand_by_again(replica)

    def _took_effect(self, pending: Pending, what: str) -> None:
        self._tick()
        self.replicas += 1 if pending.decision.action == ADD else -1
        recent = latest(self.window, self.knobs.window_steps, getattr(self.reader, "tenants", None))  # the baseline
        basis = window_signals(recent, self.clock(), pending.basis.replicas) if len(recent) >= 2 else pending.basis
        self.memory = took_effect(pending.decision, basis, self.clock(), self.memory)
        self.window, self.busy = [], []  # the next window starts with the new fleet, once it settled
        self._settling = self.settle_steps
        self.pending = None
        self.changes += 1
        self.say(f"agrpo fleet: {self.replicas} replica(s) serving: {what}")

    def bill(self) -> FleetBill:
        return FleetBill(
            dict(self.seconds_by_size), self.knobs.max_replicas, self.samples, self.price_per_hour, self.price_source
        )

    def finish(self) -> str:
        """Stop any change under way (the launcher stops the processes) and return the end-of-run lines: the fleet's
        replica-seconds by size and changes, then what it cost beside the largest fixed fleet (agrpo/fleet/cost.py)."""
        self._tick()
        self._write_state()
        by_size = ", ".join(
            f"{size} replica(s) {seconds:.0f} s" for size, seconds in sorted(self.seconds_by_size.items()) if seconds
        )
        head = (
            f"agrpo fleet: {self.replica_seconds():.0f} replica-seconds ({by_size}); {self.changes} change(s), "
            f"{self.replicas} replica(s) at the end"
        )
        if self.lost:
            head += f"; {self.lost} lost, {self.replaced} replaced"
        if self.skipped.total:
            head += f"; {self.skipped.summary()}"
        return "\n".join([head, *fleet_cost_lines(self.bill())])
