"""Sweeps on one shared fleet: `python -m agrpo -m +recipe=smoke lora.r=1,4,8,16 inference.shared_fleet=sweep`.

Two parts, both only when a multirun names `inference.shared_fleet` (docs/shared_fleet.md, "Sweeps on one fleet"):
- `concurrent_argv` (the CLI, before Hydra parses): the points run at once, on hydra-joblib-launcher, unless the user
  chose a launcher: `hydra/launcher=joblib hydra.launcher.n_jobs=N`, N = the points, at most the fleet's tenants;
- `SharedFleetSweep` (a Hydra callback, conf/config.yaml): at multirun start, when no fleet of that name runs, starts
  `agrpo fleet up NAME <the sweep's overrides that are not swept>` in its own process group (output to
  <sweep dir>/fleet_<NAME>.log), waits for its `fleet NAME ready at URL` line, and stops it when the multirun ends,
  fails or is interrupted (atexit; the launcher's watchdog if this process is killed). A fleet it did not start is
  left running.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from agrpo.errors import AgrpoError, LaunchError

FLEET_KEY = "inference.shared_fleet"
TENANTS_KEY = "inference.shared.max_tenants"
# Swept keys that size the fleet (its LoRA rank capacity, its LoRA slots per tenant): the fleet must fit every point,
# so it starts at their largest value. Other swept keys are the points' own and stay out of `fleet up`.
SIZING_KEYS = ("lora.r", "trainer.max_staleness")
FLEET_NOTE = "sweep_fleet.json"  # <sweep dir>/: which fleet the sweep ran on, its run_dir, whether the sweep started it
READY = re.compile(r"^fleet (\S+) ready at (\S+)\s*$", re.M)


def _parse(args: Sequence[str]) -> list[Any] | None:
    """Hydra's own parse of the override arguments (flags left out); None when Hydra would refuse them anyway."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides([a for a in args if "=" in a and not a.startswith("-")])
    except OverrideParseException:
        return None


def fleet_name(overrides: Sequence[str]) -> str | None:
    """The fleet a sweep's overrides name (`inference.shared_fleet=NAME`); None when none or when it is swept."""
    for override in _parse(overrides) or []:
        if override.key_or_group == FLEET_KEY and not override.is_sweep_override():
            return str(override.value())
    return None


def point_count(overrides: Sequence[str]) -> int | None:
    """How many points a basic sweep of `overrides` has (the product of its lists); None for a sweep it cannot count:
    Optuna's intervals, or no list at all (a recipe's sweeper holds the search space: recipes/smoke_optuna.yaml)."""
    parsed = _parse(overrides) or []
    sweeps = [o for o in parsed if o.is_sweep_override() and not o.key_or_group.startswith("hydra")]
    if not sweeps or any(not o.is_discrete_sweep() for o in sweeps):
        return None
    return math.prod(len(list(o.sweep_string_iterator())) for o in sweeps)


def joblib_args(argv: Sequence[str], max_tenants: int) -> list[str]:
    """`argv` with the joblib launcher added when it is a multirun naming a shared fleet and no launcher was chosen
    (pure). n_jobs: the points, capped at the fleet's tenants (more at once would be refused a seat)."""
    args = list(argv[1:])
    if not {"-m", "--multirun"} & set(args) or fleet_name(args) is None:
        return list(argv)
    keys = {o.key_or_group for o in _parse(args) or []}
    if "hydra/launcher" in keys:
        return list(argv)
    extra = ["hydra/launcher=joblib"]
    if "hydra.launcher.n_jobs" not in keys:
        points = point_count(args)
        extra.append(f"hydra.launcher.n_jobs={max_tenants if points is None else max(1, min(points, max_tenants))}")
    return [*argv, *extra]


def tenants_of(argv: Sequence[str]) -> int:
    """The fleet's tenant cap: the running fleet's record, else `inference.shared.max_tenants=` on the command line,
    else the schema's default."""
    name = fleet_name(list(argv[1:]))
    record = running_fleet(name) if name else None
    if record is not None:
        return int(record.max_tenants)
    for override in _parse(list(argv[1:])) or []:
        if override.key_or_group == TENANTS_KEY and not override.is_sweep_override():
            return int(override.value())
    from agrpo.config.schema.inference import SharedFleetConfig

    return SharedFleetConfig().max_tenants


def concurrent_argv(argv: Sequence[str]) -> list[str]:
    """The CLI's argv, with the joblib launcher when a multirun names a shared fleet."""
    args = list(argv[1:])
    if not {"-m", "--multirun"} & set(args):
        return list(argv)
    one_sweep_dir_in_workers()
    if fleet_name(args) is None:
        return list(argv)
    return joblib_args(argv, tenants_of(argv))


def one_sweep_dir_in_workers() -> None:
    """A launcher that runs points in other processes (joblib's workers) composes each point's config there again:
    `${agrpo_run_suffix:}` (pid + random, agrpo/paths.py) would differ in each and scatter the points over several
    sweep dirs. Hydra copies the sweep's resolver cache into each point's config (so `${now:}` agrees): cached, the
    suffix is the sweep's everywhere."""
    from agrpo.paths import RESOLVER, run_suffix

    OmegaConf.register_new_resolver(RESOLVER, run_suffix, use_cache=True, replace=True)


def fleet_overrides(task: Sequence[str]) -> list[str]:
    """What `agrpo fleet up` gets from a sweep's overrides (pure): those not swept, less the fleet's name; a swept
    sizing key (SIZING_KEYS) at its largest value, so that every point fits the fleet."""
    kept = []
    for text, override in zip([t for t in task if "=" in t and not t.startswith("-")], _parse(task) or []):
        key = override.key_or_group
        if key == FLEET_KEY:
            continue
        if not override.is_sweep_override():
            kept.append(text)
        elif key in SIZING_KEYS and override.is_discrete_sweep():
            kept.append(f"{key}={max(int(v) for v in override.sweep_string_iterator())}")
    return kept


def ready_url(log_text: str, name: str) -> str | None:
    """The URL of `fleet NAME ready at URL` in the fleet's output, if it has said so."""
    for match in READY.finditer(log_text):
        if match.group(1) == name:
            return match.group(2)
    return None


def running_fleet(name: str) -> Any | None:
    """The registry's record of fleet `name` when it runs, else None (missing or stale)."""
    from agrpo.errors import ConfigError
    from agrpo.fleet.registry import read_fleet

    try:
        return read_fleet(name)
    except ConfigError:
        return None


class NotedSignals:
    """While the sweep waits for its fleet, SIGINT/SIGTERM/SIGHUP are noted, not raised: a KeyboardInterrupt raised
    at an arbitrary bytecode can land inside subprocess's own bookkeeping (Popen.poll() between taking its waitpid
    lock and the `try` that releases it) and leave the fleet unstoppable; the wait loop acts on the note instead."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.noted: str | None = None
        self.previous: dict[int, Any] = {}

    def _note(self, signum: int, _frame: Any) -> None:
        self.noted = self.noted or signal.Signals(signum).name

    def __enter__(self) -> NotedSignals:
        for sig in self.SIGNALS:
            try:
                self.previous[sig] = signal.signal(sig, self._note)
            except ValueError:  # not the main thread: the signals are not ours to handle
                break
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# What every point imports before it can register with the fleet (prepare checks TRL's names, the plan asks torch for
# GPUs, the data checks open the tokenizer): ~5-8 s of CPU a worker on the 2-core CI machine.
WARM_MODULES = ("torch", "transformers", "trl", "agrpo.cli", "agrpo.config.prepare", "agrpo.launchers.local")


def warm_worker(modules: Sequence[str] = WARM_MODULES) -> int:
    """Run in a joblib worker: import the points' modules there (a worker keeps them for the points it runs)."""
    import importlib

    for module in modules:
        importlib.import_module(module)
    return os.getpid()


class WarmWorkers:
    """While the sweep's fleet boots, hydra-joblib-launcher's workers are started and import what a point needs, in a
    thread: the launcher then reuses them (joblib keeps one loky executor per process and reuses it for the same
    arguments, which these are: the launcher's own config, processed as it does), so the points reach the fleet
    seconds after it is ready instead of spawning and importing then, with the replicas idle (docs/shared_fleet.md,
    "Replica-seconds"). Best effort: any other launcher, or any failure, warms nothing."""

    def __init__(self, config: Any, modules: Sequence[str] = WARM_MODULES):
        import threading

        self.error: BaseException | None = None
        self.thread: Any = None
        self.pids: list[int] = []
        self.modules = tuple(modules)
        launcher = OmegaConf.select(config, "hydra.launcher", default=None)
        if launcher is None or not str(launcher.get("_target_", "")).endswith("JoblibLauncher"):
            return
        joblib_cfg = {k: v for k, v in OmegaConf.to_container(launcher, resolve=True).items() if k != "_target_"}
        self.thread = threading.Thread(target=self._run, args=(joblib_cfg,), name="warm-joblib-workers", daemon=True)
        self.thread.start()

    def _run(self, joblib_cfg: dict[str, Any]) -> None:
        try:
            from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
            from joblib import Parallel, delayed

            joblib_cfg["backend"] = "loky"  # as the launcher sets it
            process_joblib_cfg(joblib_cfg)
            n_jobs = int(joblib_cfg.get("n_jobs") or 1)
            self.pids = list(Parallel(**joblib_cfg)(delayed(warm_worker)(self.modules) for _ in range(max(1, n_jobs))))
        except BaseException as error:  # noqa: BLE001 - a warm-up that fails only costs the time it saves
            self.error = error

    def join(self, timeout_s: float = 120.0) -> None:
        """Wait for the warm-up (the launcher must not start its own Parallel while this one runs)."""
        if self.thread is not None:
            self.thread.join(timeout_s)


class SharedFleetSweep(Callback):
    """Starts the sweep's fleet when the multirun starts (if it is not up), stops it when the multirun ends, only if it
    started it. `command`: the `fleet up` command (tests put a stand-in there)."""

    def __init__(self, command: Sequence[str] | None = None, stop_timeout_s: float = 60.0) -> None:
        self.command = list(command) if command else [sys.executable, "-m", "agrpo", "fleet", "up"]
        self.stop_timeout_s = stop_timeout_s
        self.fleet: Any = None  # the ManagedProcess of a fleet this sweep started

    def __getstate__(self) -> dict[str, Any]:
        # Hydra hands its callbacks to every joblib worker (pickled): the fleet's process stays with this process.
        return {**self.__dict__, "fleet": None}

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        task = list(config.hydra.overrides.task)
        name = fleet_name(task) or OmegaConf.select(config, FLEET_KEY, default=None)
        if not name:
            return
        if OmegaConf.select(config, "launcher.dry_run", default=False) is True:  # a dry run starts nothing
            from agrpo.launchers.shared_fleet import SWEEP_STARTS_FLEET_ENV

            up = running_fleet(name)
            if up is None:  # its points plan without the record (agrpo/launchers/shared_fleet.py)
                os.environ[SWEEP_STARTS_FLEET_ENV] = str(name)
            shown = [o for o in fleet_overrides(task) if o.partition("=")[0] != "launcher.dry_run"]
            print(f"agrpo: dry run: the sweep would start fleet {name} with: agrpo fleet up {name} "
                  f"{' '.join(shown)}" if up is None else
                  f"agrpo: dry run: the sweep would run on fleet {name} at {up.url} (already up)", flush=True)  # fmt: skip
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            with NotedSignals() as signals:
                record = running_fleet(name)
                if record is None:
                    timeout = 2 * float(OmegaConf.select(config, "inference.startup_timeout_s", default=300)) + 60
                    warm = WarmWorkers(config)  # the points' workers import what they need while the fleet boots
                    self.start(name, fleet_overrides(task), sweep_dir, timeout, signals, point_count(task))
                    warm.join()
                    record = running_fleet(name)
                else:
                    print(f"agrpo: this sweep runs on fleet {name} at {record.url} (already up: it stays up after)")
        except AgrpoError as error:
            self.stop()
            print(f"agrpo: error: {error}", file=sys.stderr, flush=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) while the fleet boots: one line, not Hydra's traceback
            self.stop()
            print(f"agrpo: interrupted while fleet {name} started; no point ran", file=sys.stderr, flush=True)
            sys.exit(130)
        note = {"name": name, "run_dir": getattr(record, "run_dir", None), "started_by_sweep": self.fleet is not None}
        (sweep_dir / FLEET_NOTE).write_text(json.dumps(note, indent=2))

    def start(
        self,
        name: str,
        overrides: list[str],
        sweep_dir: Path,
        timeout_s: float,
        signals: NotedSignals | None = None,
        points: int | None = None,
    ) -> str:
        """`fleet up NAME overrides` in its own process group; returns its URL once it says it is ready. Raises
        KeyboardInterrupt at its next look when `signals` noted a stop signal. `points`: the sweep's points, when it
        can count them; the fleet then stops by itself once that many runs registered and all left (fleet_up.py
        STOP_AFTER_ENV), without waiting for the sweep's end to reach this callback."""
        from agrpo.processes.managed import ManagedProcess, tail

        log_path = sweep_dir / f"fleet_{name}.log"
        argv = [*self.command, name, *overrides]
        print(
            f"agrpo: starting fleet {name} for this sweep: agrpo fleet up {name} {' '.join(overrides)} "
            f"(output in {log_path})",
            flush=True,
        )
        from agrpo.launchers.fleet_up import STOP_AFTER_ENV

        env = {"PYTHONUNBUFFERED": "1", **({STOP_AFTER_ENV: str(points)} if points else {})}
        self.fleet = ManagedProcess(f"fleet {name}", argv, env=env, log_path=log_path)
        atexit.register(self.stop)  # a failed or interrupted sweep never reaches on_multirun_end
        self.fleet.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if signals is not None and signals.noted:
                raise KeyboardInterrupt(signals.noted)
            url = ready_url(log_path.read_text(errors="replace") if log_path.is_file() else "", name)
            if url:
                print(f"agrpo: fleet {name} ready at {url}", flush=True)
                return url
            if not self.fleet.alive():
                raise LaunchError(
                    f"the sweep's fleet {name} exited with code {self.fleet.exit_code} before it was ready, so no "
                    f"point ran; its last lines ({log_path}):\n{tail(log_path)}"
                )
            time.sleep(0.5)
        raise LaunchError(
            f"the sweep's fleet {name} did not say it was ready within {timeout_s:.0f} s (twice "
            f"inference.startup_timeout_s, plus a minute); it was stopped. Its last lines ({log_path}):\n{tail(log_path)}"
        )

    def stop(self) -> None:
        """Stop the fleet this sweep started (SIGTERM to its group, SIGKILL after stop_timeout_s); idempotent."""
        fleet, self.fleet = self.fleet, None
        if fleet is not None and fleet.popen is not None:
            from agrpo.processes.managed import stop_all

            stop_all([fleet], self.stop_timeout_s)
            print(f"agrpo: fleet {fleet.name.split()[-1]} stopped (started for this sweep)", flush=True)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        self.stop()
