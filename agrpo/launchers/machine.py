"""How the local plan shares this machine: its cores and GPUs between the replicas the plan starts and the trainer,
and whether the trainer may load while they boot (pure: the caller says which cores and GPUs this process has)."""

from __future__ import annotations

from collections.abc import Sequence

from agrpo.config.schema import RunConfig
from agrpo.cpus import CpuSplit, split_fleet_cores
from agrpo.launchers.gpus import assign_gpus, one_process_trainer_gpus, to_physical
from agrpo.launchers.plan import ProcessSpec


def is_loopback_url(url: str) -> bool:
    """A replica given by URL on this machine (e.g. started by hand) pins a core like one the plan starts."""
    from urllib.parse import urlparse

    host = urlparse(url).hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def share_cpu_cores(cfg: RunConfig, cpu_ids: Sequence[int], pinned_replicas: int, most_replicas: int = 0) -> CpuSplit:
    """This process's cores shared out: each replica the plan starts on CPU pins its own, the trainer has the rest
    (a replica on this machine that the plan does not start takes one too). With a fleet that grows to
    `most_replicas`, the replica slots are those of the largest fleet (agrpo/cpus.py)."""
    inference = cfg.inference
    return split_fleet_cores(
        cpu_ids,
        pinned_replicas,
        max(most_replicas, pinned_replicas),
        inference.cpu_cores_per_replica,
        cfg.trainer.cpu_threads,
        unpinned_replicas=sum(map(is_loopback_url, inference.urls)),
    )


def split_gpus(
    cfg: RunConfig, replicas: int, num_gpus: int, visible_gpus: list[str] | None
) -> tuple[list[int | str] | None, list[list[int]] | None, str | None]:
    """(the trainer's GPUs by machine id, each replica's GPU indices, a note on GPUs left idle) for this machine;
    `replicas`: how many this machine may start (0: they run elsewhere; an auto fleet's most)."""
    trainer_gpus, replica_gpus = None, None
    if replicas:
        trainer_gpus, replica_gpus = assign_gpus(
            num_gpus, replicas, cfg.inference.gpus_per_replica, cfg.trainer.gpus, cfg.inference.gpus
        )
    elif num_gpus > 0:  # replicas run elsewhere (e.g. inside a trainer Job): every GPU here is the trainer's
        trainer_gpus = list(cfg.trainer.gpus) if cfg.trainer.gpus else list(range(num_gpus))
    trainer_gpus, idle_note = one_process_trainer_gpus(trainer_gpus, str(cfg.launcher.name), bool(cfg.trainer.gpus))
    return to_physical(trainer_gpus, visible_gpus), replica_gpus, idle_note


def slot_devices(
    slots: int, replica_gpus: list[list[int]] | None, visible_gpus: list[str] | None, cpus: CpuSplit
) -> list[tuple[int, list[int] | None, list[int] | None]]:
    """(index, GPUs, cores) of each replica slot."""
    return [
        (
            index,
            to_physical(replica_gpus[index], visible_gpus) if replica_gpus else None,
            cpus.replica_cores[index] if cpus.replica_cores else None,
        )
        for index in range(slots)
    ]


def trainer_start(
    cfg: RunConfig, trainer_gpus: Sequence[int | str] | None, slots: Sequence[ProcessSpec]
) -> tuple[bool, str]:
    """(whether the trainer starts with the replicas of `slots` and loads while they boot, why it waits for them
    otherwise). It waits where it shares a GPU with a replica, spares included: vLLM sizes its KV cache from the
    memory it finds free as it boots, so a trainer loading meanwhile would take its share or fail its check."""
    if not slots:
        return False, ""
    if not cfg.launcher.trainer_during_boot:
        return False, "launcher.trainer_during_boot=false"
    replica_gpus = {str(gpu) for spec in slots for gpu in spec.gpus or []}
    if replica_gpus and not trainer_gpus:
        return False, "the trainer has no GPUs of its own"
    shared = sorted(replica_gpus & {str(gpu) for gpu in trainer_gpus or []})
    if shared:
        return False, f"it shares GPU {', '.join(shared)} with a replica, whose boot measures the free memory"
    return True, ""
