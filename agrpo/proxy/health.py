"""Replica health: marking a replica unhealthy, probing it, and re-admitting it once it holds the current state.

A replica is marked unhealthy when it gives no HTTP answer (a routed request or a broadcast: connection refused,
reset, timeout) or fails its `/health` probe (every `--health-interval-s`, answered within `--health-timeout-s`).
One that stops answering (`hung`: a probe or a request timed out; SIGSTOPped, swapping, a stuck host) costs the run
at most `--health-interval-s` + `--health-timeout-s` (7 s with the defaults): from the moment it is marked, every
broadcast still waiting for it goes on without it (broadcast.abandoned_when_down) and its routed requests in flight
are retried on the other replicas. vLLM answers `/health` from its API server's event loop, which stays responsive
while the engine generates, so a replica busy with long generations is not marked (docs/failures.md).

A replica coming back (its probe answers again) gets the loaded adapters and the pause state replayed, and versions
retired meanwhile unloaded (with a load it was dropped from and that landed late), before it takes traffic again.
This part of `Control` is a mixin: it uses the control plane's state (`loaded`, `retired`, `owed`, `paused_qs`,
`generation`, the lock) and its `_send`.
"""

import asyncio
import json
import logging

from agrpo.proxy import broadcast
from agrpo.proxy.replicas import Replica
from agrpo.proxy.retired import listed_models
from agrpo.proxy.upstream import describe_error, send_once

log = logging.getLogger("agrpo.proxy")


class ReplicaHealth:
    """Marking down, probing and re-admitting replicas (mixed into `control.Control`)."""

    # ------------------------------------------------------------------ failures
    def transport_failed(self, replica: Replica, err: BaseException) -> str:
        """No HTTP answer: the replica is down until a probe says otherwise."""
        reason = describe_error(err)
        self.mark_unhealthy(replica, reason, hung=isinstance(err, asyncio.TimeoutError))
        return f"replica {replica.index}: {reason}"

    def mark_unhealthy(self, replica: Replica, reason: str, hung: bool) -> None:
        """Out of rotation until a probe re-admits it (with the current adapters). A broadcast still waiting for its
        answer stops waiting at once (broadcast.abandoned_when_down). One that stopped answering (`hung`: timeouts,
        e.g. SIGSTOPped or swapping) also has its routed requests in flight dropped, so the routed path retries them
        on the other replicas instead of waiting for it."""
        if not replica.mark_down(reason, hung, self._now()):
            return
        if not hung:
            log.warning("replica %d (%s) marked unhealthy: %s", replica.index, replica.url, reason)
            return
        in_flight = list(replica.exchanges)
        for exchange in in_flight:
            exchange.drop(f"replica {replica.index} stopped answering ({reason})")
        log.warning(
            "replica %d (%s) marked unhealthy: hung, not answering (%s); dropped from every broadcast in progress, "
            "its %d request(s) in flight handed back (each retried on another replica, or answered 410 if its adapter "
            "version was retired meanwhile); training goes on without it",
            replica.index,
            replica.url,
            reason,
            len(in_flight),
        )

    # ------------------------------------------------------------------ health
    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(r) for r in self.replicas))

    async def probe(self, replica: Replica) -> bool:
        """GET /health; a replica coming back is re-synchronised before it takes traffic."""
        reply = await send_once(self.server.session, replica, "GET", "/health", b"", self._headers, self._probe_timeout)
        if not reply.ok:
            hung = reply.status is None and reply.error == "timed out"
            timeout = self.settings.health_timeout_s
            reason = f"no answer to /health within {timeout:g}s" if hung else f"health probe: {reply.summary()}"
            self.mark_unhealthy(replica, reason, hung)
            return False
        if not replica.healthy and not replica.admitting:
            await self._admit(replica)
        return replica.healthy

    async def _admit(self, replica: Replica) -> None:
        """Replay the loaded adapters and the pause, bounded by --admit-timeout-s.

        The replay runs without the control lock (a replica that answers /health but hangs on
        loads must not stall every broadcast); the lock is taken only to check that no state
        change happened meanwhile and to admit. If one did, the replay runs again.
        """
        replica.admitting = True
        try:
            await asyncio.wait_for(self._catch_up(replica), self.settings.admit_timeout_s)
        except asyncio.TimeoutError:
            replica.last_error = (
                f"re-admission did not finish within {self.settings.admit_timeout_s:g}s (--admit-timeout-s)"
            )
            log.warning("replica %d (%s) not re-admitted: %s", replica.index, replica.url, replica.last_error)
        finally:
            replica.admitting = False

    async def _catch_up(self, replica: Replica) -> None:
        if not await self._unload_strays(replica):
            return
        paused_by_us = None
        while True:
            generation = self.generation
            loaded, paused_qs = dict(self.loaded), self.paused_qs
            for name, body in loaded.items():
                reply = await self._send(replica, "POST", "/v1/load_lora_adapter", body)
                if not broadcast.serves_adapter(reply):
                    replica.last_error = f"replaying adapter {name}: {reply.summary()}"
                    log.warning("replica %d not re-admitted: %s", replica.index, replica.last_error)
                    return
            wanted = paused_qs
            if wanted != paused_by_us:
                step = wanted if wanted is not None else "/resume"
                reply = await self._send(replica, "POST", step, b"")
                if not reply.ok:
                    replica.last_error = f"replaying {step}: {reply.summary()}"
                    return
                paused_by_us = wanted
            if replica.hung and not await self._unload_strays(replica):  # a load it was dropped from landed late
                return
            async with self._lock:
                if self.replicas.get(replica.index) is not replica:
                    return  # removed meanwhile
                if self.generation == generation:
                    self._admitted(replica, loaded)
                    return

    def _admitted(self, replica: Replica, loaded: dict[str, bytes]) -> None:
        out_s = None if replica.down_since is None else self._now() - replica.down_since
        was = "hung, " if replica.hung else ""
        replica.adapters = set(loaded)
        replica.mark_up()
        back = "" if out_s is None else f" ({was}out of rotation for {out_s:.1f}s)"
        log.info("replica %d (%s) admitted%s, serving %d adapter(s)", replica.index, replica.url, back, len(loaded))

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _unload_strays(self, replica: Replica) -> bool:
        """Before re-admission, unload what the replica must not serve: versions retired while it was out, and any
        failed load it did not answer (that load may have landed after the timeout). Such a load is waited for until
        its unload succeeds or --broadcast-timeout-s has passed since. False: not admitted now (next probe retries)."""
        reply = await self._send(replica, "GET", "/v1/models", b"")
        retired = [n for n in listed_models(reply.body) if n in self.retired and n not in self.loaded]
        owed = self.owed.get(replica.index, {})
        now = asyncio.get_running_loop().time()
        for name in [*retired, *owed]:
            undo = await self._send(
                replica, "POST", "/v1/unload_lora_adapter", json.dumps({"lora_name": name}).encode()
            )
            if undo.ok:
                log.info("replica %d (%s): unloaded stray adapter %s", replica.index, replica.url, name)
            waiting = name in owed and not undo.ok and (undo.status is None or now < owed[name])
            if waiting:
                replica.last_error = f"waiting to undo the failed load of {name}: {undo.summary()}"
                return False
            owed.pop(name, None)
        self.owed.pop(replica.index, None)
        return True

    def start_probing(self) -> None:
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_forever())

    async def stop_probing(self) -> None:
        for task in [*self._loading, *self._probes.values()]:
            task.cancel()
        self._probes.clear()
        if self._probe_task is not None:
            self._probe_task.cancel()
            try:
                await self._probe_task
            except asyncio.CancelledError:
                pass
            self._probe_task = None

    async def _probe_forever(self) -> None:
        """Every --health-interval-s, probe each replica whose last probe has ended. Each replica's probe is its own
        task: one that hangs until --health-timeout-s, or a re-admission replaying adapters, delays no other's."""
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            for index in [i for i in self._probes if self.replicas.get(i) is None]:  # removed meanwhile
                del self._probes[index]
            for replica in self.replicas:
                running = self._probes.get(replica.index)
                if running is None or running.done():
                    self._probes[replica.index] = asyncio.get_running_loop().create_task(self._probe_logged(replica))

    async def _probe_logged(self, replica: Replica) -> None:
        try:
            await self.probe(replica)
        except Exception:  # keep probing whatever happens
            log.exception("health probe of replica %d failed", replica.index)
