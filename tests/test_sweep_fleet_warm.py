"""agrpo/sweep_fleet.py WarmWorkers: while a sweep's fleet boots, hydra-joblib-launcher's loky workers are started and
import what a point needs, and the launcher's own Parallel then reuses those very processes (real joblib, real loky
workers; the launcher's config as Hydra composes it for `hydra/launcher=joblib`)."""

from __future__ import annotations

import os

from joblib import Parallel, delayed
from omegaconf import OmegaConf

from agrpo.sweep_fleet import WarmWorkers


def joblib_launcher(n_jobs: int):
    from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf

    return OmegaConf.create({"hydra": {"launcher": {**OmegaConf.structured(JobLibLauncherConf), "n_jobs": n_jobs}}})


def test_the_launchers_parallel_reuses_the_workers_warmed_while_the_fleet_booted():
    config = joblib_launcher(2)
    warm = WarmWorkers(config, modules=("json", "agrpo.errors"))
    warm.join()
    assert warm.error is None and len(warm.pids) == 2 and os.getpid() not in warm.pids
    # what hydra-joblib-launcher does with the same config (its _core.launch): the same executor, the same workers
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg

    joblib_cfg = {k: v for k, v in OmegaConf.to_container(config.hydra.launcher).items() if k != "_target_"}
    joblib_cfg["backend"] = "loky"
    process_joblib_cfg(joblib_cfg)
    pids = Parallel(**joblib_cfg)(delayed(os.getpid)() for _ in range(4))
    assert set(pids) <= set(warm.pids)


def test_another_launcher_warms_nothing():
    warm = WarmWorkers(OmegaConf.create({"hydra": {"launcher": {"_target_": "hydra._internal.BasicLauncher"}}}))
    warm.join()
    assert warm.thread is None and warm.pids == []
