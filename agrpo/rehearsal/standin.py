"""The stand-in's state and its Jobs' lifecycle (I/O): Jobs as local process groups, buckets as local folders.

`StandIn` is the backend of the stand-in Hub API (hub_api.py, shared with the tests' fake Hub): create/list/
inspect/cancel Jobs, stream their logs, create and list buckets, write and read bucket files. A watcher thread moves each Job through its stages (jobs.py decides them):
process exit, timeout, cancel, preemption (`preempt(job_id)`, for tests and users who want to see a requeue), and
the platform's requeue of a Job created with attempts > 1.
"""

from __future__ import annotations

import json
import logging
import secrets as secrets_module
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from agrpo.rehearsal import jobs as J
from agrpo.rehearsal import runner
from agrpo.rehearsal.bucket import Visibility, listing
from agrpo.rehearsal.hub_api import HubBackend
from agrpo.rehearsal.hub_rules import hardware_list

log = logging.getLogger(__name__)
REQUEUE_DELAY_S = 1.0  # how long a requeued Job shows ERROR before it runs again


class StandIn(HubBackend):
    def __init__(
        self,
        root: Path,
        namespace: str,
        token: str,
        lag_s: float = 1.0,
        negative_cache_s: float = 30.0,
        stop_grace_s: float = 10.0,
        preempt_trainer_after_s: float | None = None,
        prices: dict[str, float] | None = None,
    ):
        self.root, self.namespace, self.token = root, namespace, token
        self.prices = prices  # $/hour per flavor for the hardware list; None: the list is not served (404)
        self.preempt_trainer_after_s = preempt_trainer_after_s
        self.lag_s, self.negative_cache_s, self.stop_grace_s = lag_s, negative_cache_s, stop_grace_s
        self.jobs: dict[str, J.JobRecord] = {}
        self.procs: dict[str, Any] = {}  # job id -> Popen of its current attempt
        self.reasons: dict[str, str] = {}  # job id -> why the stand-in is ending it (cancel/timeout/preempt)
        self.netns: dict[str, runner.NetNS] = {}
        self.stopping: set[int] = set()  # pids of attempts being stopped (one stop thread each)
        self.views: dict[str, Visibility] = {}  # bucket id -> its listing's visibility
        self.api_url = ""  # set by the server once it listens
        self.gateway = ""  # 'host:port' of the exposed-port gateway
        self.lock = threading.RLock()
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="rehearsal-jobs", daemon=True)

    # --- buckets
    def bucket_dir(self, bucket_id: str) -> Path:
        return self.root / "buckets" / bucket_id

    def create_bucket(self, bucket_id: str) -> bool:
        """True when it was created now (False: it existed, the Hub's 409)."""
        with self.lock:
            existed = bucket_id in self.views
            self.views.setdefault(bucket_id, Visibility(self.lag_s, self.negative_cache_s))
            path = self.bucket_dir(bucket_id)
            existed = existed or path.exists()
            path.mkdir(parents=True, exist_ok=True)
            return not existed

    def bucket_exists(self, bucket_id: str) -> bool:
        return self.bucket_dir(bucket_id).is_dir()

    def _scan(self, bucket_id: str, now: float) -> dict[str, int]:
        root, view = (
            self.bucket_dir(bucket_id),
            self.views.setdefault(bucket_id, Visibility(self.lag_s, self.negative_cache_s)),
        )
        files = {}
        if root.exists():
            for path in root.rglob("*"):
                if path.is_file() and not path.name.startswith(".agrpo-rehearsal-tmp"):
                    rel = path.relative_to(root).as_posix()
                    stat = path.stat()
                    files[rel] = stat.st_size
                    view.seen(rel, min(stat.st_mtime, now))  # written then: the lag counts from the write
        return files

    def list_bucket(self, bucket_id: str, prefix: str) -> list[dict]:
        with self.lock:
            now = time.time()
            return listing(self._scan(bucket_id, now), prefix, self.views[bucket_id], now)

    def write_file(self, bucket_id: str, dest: str, data: bytes) -> None:
        """A file uploaded through the API: in the bucket folder and listed at once (the Hub lists an upload it
        acknowledged)."""
        target = self.bucket_dir(bucket_id) / dest
        if ".." in Path(dest).parts:
            raise ValueError(f"bad path {dest}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".agrpo-rehearsal-tmp-{target.name}")
        tmp.write_bytes(data)
        with self.lock:
            self.views.setdefault(bucket_id, Visibility(self.lag_s, self.negative_cache_s)).seen(
                dest, time.time(), preexisting=True
            )
            tmp.replace(target)

    def read_file(self, bucket_id: str, path: str) -> bytes | None:
        """A file as the bucket lists it (the download route of `agrpo pull`); None when it is not listed."""
        with self.lock:
            now = time.time()
            self._scan(bucket_id, now)
            view = self.views[bucket_id]
            if not view.visible(path, now):
                return None
        target = self.bucket_dir(bucket_id) / path
        return target.read_bytes() if target.is_file() else None

    def mount_lookup(self, job_id: str, path: str) -> bool:
        """Whether this Job's bucket mount shows `path` now; a miss is cached for negative_cache_s (bucket.py)."""
        job = self.jobs.get(job_id)
        for volume in (job.spec.get("volumes") or []) if job else []:
            mount = volume["mountPath"].rstrip("/") + "/"
            if path.startswith(mount):
                rel = path[len(mount) :].strip("/")
                with self.lock:
                    self._scan(volume["source"], time.time())
                    return self.views[volume["source"]].lookup(rel, time.time())
        return True  # not on a bucket mount: nothing modelled

    # --- jobs
    def create_job(self, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            job = J.JobRecord(id=secrets_module.token_hex(12), namespace=namespace, spec=spec, created=time.time())
            job.history.append("SCHEDULING")
            self.jobs[job.id] = job
            body = job.to_json(self.gateway, time.time())
        threading.Thread(target=self._start, args=(job,), name=f"rehearsal-start-{job.id}", daemon=True).start()
        return body

    def list_jobs(self, labels: list[str], stages: list[str]) -> list[dict[str, Any]]:
        with self.lock:
            now = time.time()
            return [
                job.to_json(self.gateway, now)
                for job in self.jobs.values()
                if J.matches_labels(job, labels) and (not stages or job.stage in stages)
            ]

    def job_json(self, job_id: str) -> dict[str, Any] | None:
        with self.lock:
            job = self.jobs.get(job_id)
            return job.to_json(self.gateway, time.time()) if job else None

    def cancel_job(self, job_id: str) -> None:
        self.cancel(job_id)

    def hardware(self) -> list[dict[str, Any]] | None:
        """The hardware list at the prices the rehearsal was given (it bills nothing: a rehearsal's cost is what its
        Jobs would have cost on those flavors)."""
        return hardware_list(self.prices) if self.prices is not None else None

    def log_batches(self, job_id: str, tail: int | None):
        """Every line so far, then new lines while the Job runs; the stream ends when the Job is over."""
        job, path, offset, first = self.jobs[job_id], self.log_path(job_id), 0, True
        while True:
            over = job.stage in J.TERMINAL and job_id not in self.procs
            text = b""
            if path.exists():
                with open(path, "rb") as log:  # only what was added since the last poll
                    log.seek(offset)
                    text = log.read()
            complete = text[: text.rfind(b"\n") + 1] if not over else text
            offset += len(complete)
            lines = complete.decode(errors="replace").splitlines()
            if first and tail:
                lines = lines[-tail:]
            first = False
            yield lines
            if over:
                return
            time.sleep(0.3)

    def _mounts(self, job: J.JobRecord) -> list[tuple[str, str, bool]]:
        mounts = []
        for volume in job.spec.get("volumes") or []:
            if not self.bucket_exists(volume["source"]):  # the API refused it already; a bucket deleted since
                raise ValueError(f"bucket {volume['source']} does not exist")
            mounts.append((str(self.bucket_dir(volume["source"])), volume["mountPath"], bool(volume.get("readOnly"))))
        return mounts

    def _hosts_text(self) -> str:
        """/etc/hosts plus every exposed-port name of the Jobs that exist now, at the gateway."""
        gateway_ip = self.gateway.rsplit(":", 1)[0]
        lines = [Path("/etc/hosts").read_text()]
        with self.lock:
            for other in self.jobs.values():
                lines += [f"{gateway_ip} {J.exposed_host(other.id, port)}" for port in other.exposed_ports]
        return "\n".join(lines) + "\n"

    def _hosts_file(self, job_dir: Path) -> Path:
        path = job_dir / "hosts"
        path.write_text(self._hosts_text())
        return path

    def _refresh_hosts(self) -> None:
        """A Job with exposed ports was created: every Job's hosts file names it too, as the Hub's DNS would (a
        trainer Job that launches replica Jobs reaches them). Rewritten in place: the bind mount sees the change."""
        text = self._hosts_text()
        for path in (self.root / "jobs").glob("*/hosts"):
            try:
                with path.open("r+") as handle:  # same inode: the Job's bind-mounted /etc/hosts follows
                    handle.write(text)
                    handle.truncate()
            except OSError:
                continue

    def _start(self, job: J.JobRecord) -> None:
        job_dir = self.root / "jobs" / job.id
        try:
            (job_dir / "home").mkdir(parents=True, exist_ok=True)
            bin_dir = runner.make_image(job_dir)
            netns = None
            if job.exposed_ports:
                with runner.NETNS_LOCK:  # pick and take the subnet at once: Jobs start in parallel
                    host_ip, job_ip = runner.free_subnet(len(self.netns) + 1)
                    netns = runner.NetNS(f"ag{job.id[:10]}", host_ip, job_ip)
                    with self.lock:
                        self.netns[job.id] = netns
                    netns.create()
                self._refresh_hosts()
            command = [*(job.spec.get("command") or []), *(job.spec.get("arguments") or [])]
            argv = runner.wrapper_argv(
                command, self._mounts(job), self._hosts_file(job_dir), job_dir / "home", netns.name if netns else None
            )
            env = runner.job_env(
                job.spec.get("environment") or {},
                job.spec.get("secrets") or {},
                bin_dir,
                job_dir / "home",
                job.id,
                self.api_url,
            )
        except Exception as error:  # the Job cannot start: it ends in ERROR, saying why
            with self.lock:
                job.move("ERROR", f"rehearsal could not start the Job: {type(error).__name__}: {error}", time.time())
            return
        with self.lock:
            if job.cancel_requested or self.closing.is_set():
                job.move("CANCELED", "canceled by user", time.time())
                return
            self.procs[job.id] = runner.start(argv, env, job_dir / "log.txt")
            self.reasons.pop(job.id, None)
            job.move("RUNNING", None, time.time())

    def job_url_ip(self, job_id: str) -> str | None:
        """Where the gateway reaches this Job's exposed ports."""
        netns = self.netns.get(job_id)
        return netns.job_ip if netns else None

    def log_path(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id / "log.txt"

    def _end(self, job_id: str, reason: str) -> None:
        """Stop the Job's process group (in a thread: it can take the grace period); the watcher sets its stage."""
        with self.lock:
            popen = self.procs.get(job_id)
            self.reasons.setdefault(job_id, reason)
            if popen is None or popen.pid in self.stopping:
                return
            self.stopping.add(popen.pid)
        if popen is not None:
            threading.Thread(target=runner.stop_group, args=(popen, self.stop_grace_s), daemon=True).start()

    def cancel(self, job_id: str) -> None:
        with self.lock:
            job = self.jobs[job_id]
            if job.stage in J.TERMINAL:
                return
            job.cancel_requested = True
        self._end(job_id, "cancel")

    def preempt(self, job_id: str) -> None:
        """Kill a running Job as the platform does when it reclaims the machine."""
        self._end(job_id, "preempt")

    def _watch(self) -> None:
        while not self.closing.wait(0.5):
            self.tick()

    def tick(self) -> None:
        now = time.time()
        with self.lock:
            for job_id, popen in list(self.procs.items()):
                job = self.jobs[job_id]
                if J.timed_out(job, now):
                    self._end(job_id, "timeout")
                elif J.due_for_preemption(job, now, self.preempt_trainer_after_s):
                    log.info("rehearsal: preempting trainer Job %s (attempt %d)", job_id, job.attempt)
                    self.preempt(job_id)
                code = popen.poll()
                if code is None or runner.group_alive(popen.pid):
                    if code is not None:  # the leader is gone but a child lingers: end the group
                        self._end(job_id, self.reasons.get(job_id, "exit"))
                    continue
                del self.procs[job_id]
                stage, message = J.outcome(code, job, self.reasons.pop(job_id, None))
                job.move(stage, message, now)
                log.info(
                    "rehearsal Job %s (%s) %s%s",
                    job_id,
                    job.labels.get("name"),
                    stage,
                    f": {message}" if message else "",
                )
                if J.requeues(job, stage):
                    threading.Timer(REQUEUE_DELAY_S, self._requeue, args=(job,)).start()
                elif job_id in self.netns:
                    self.netns.pop(job_id).delete()

    def _requeue(self, job: J.JobRecord) -> None:
        with self.lock:
            if job.cancel_requested or self.closing.is_set():
                return
            job.attempt += 1
            job.move("SCHEDULING", f"requeued (attempt {job.attempt} of {job.attempts})", time.time())
        netns = self.netns.pop(job.id, None)
        if netns:
            netns.delete()
        self._start(job)

    def close(self) -> list[int]:
        """Cancel every Job, wait for their groups, remove namespaces; returns pids found left (then killed)."""
        self.closing.set()
        with self.lock:
            running = [job_id for job_id, job in self.jobs.items() if job.stage not in J.TERMINAL]
        for job_id in running:
            self.cancel(job_id)
        deadline = time.monotonic() + self.stop_grace_s + 10
        while self.procs and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.2)
        left = runner.kill_marked(set(self.jobs))
        for netns in self.netns.values():
            netns.delete()
        self.netns.clear()
        self.write_summary(left)
        return left

    def write_summary(self, left: list[int]) -> None:
        """<root>/jobs.json: every Job's name, labels, flavor, command, stages, attempts, times and end (what a
        rehearsal leaves to look at, and what `replay` serves again). Secrets and env values are left out."""
        with self.lock:
            summary = {
                job_id: {
                    "name": job.labels.get("name"),
                    "labels": job.labels,
                    "flavor": job.spec.get("flavor"),
                    "image": job.spec.get("dockerImage"),
                    "command": job.spec.get("command"),
                    "stage": job.stage,
                    "message": job.message,
                    "history": job.history,
                    "attempt": job.attempt,
                    "created": job.created,
                    "started": job.started,
                    "finished": job.finished,
                    "running_s": job.running_s(job.finished or time.time()),
                }
                for job_id, job in self.jobs.items()
            }
        record = {"namespace": self.namespace, "jobs": summary, "killed_after_end": left}
        (self.root / "jobs.json").write_text(json.dumps(record, indent=1))

    @classmethod
    def revive(cls, root: Path, token: str, prices: dict[str, float] | None = None) -> "StandIn":
        """A stand-in over a finished rehearsal's folder: its buckets, and its Jobs as jobs.json recorded them."""
        path = root / "jobs.json"
        record = json.loads(path.read_text()) if path.is_file() else {"jobs": {}}
        namespaces = sorted(p.name for p in (root / "buckets").iterdir() if p.is_dir())
        stand_in = cls(root, record.get("namespace") or (namespaces or ["rehearsal"])[0], token, prices=prices)
        stand_in.lag_s = 0.0  # everything in the folder is listed: the run is over
        for job_id, seen in record["jobs"].items():
            spec = {"labels": seen["labels"], "flavor": seen.get("flavor"), "command": seen.get("command")}
            spec["dockerImage"] = seen.get("image")
            job = J.JobRecord(id=job_id, namespace=stand_in.namespace, spec=spec, created=seen.get("created") or 0.0)
            job.stage, job.message, job.history = seen["stage"], seen.get("message"), list(seen.get("history", []))
            job.attempt, job.started, job.finished = seen.get("attempt", 1), seen.get("started"), seen.get("finished")
            job.ran_s = float(seen.get("running_s") or 0.0)
            stand_in.jobs[job_id] = job
        return stand_in

    def remove_tree(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
