"""How a CPU machine's cores are split between local vLLM replicas and the trainer (pure), and how the trainer
takes its share.

vLLM's CPU build binds its model worker's OpenMP threads to cores (`VLLM_CPU_OMP_THREADS_BIND`). Left on `auto`,
every replica picks the same cores, and the trainer's threads land on them too. Giving each replica its own cores
and the trainer the rest made the smoke recipe's async steps 28-29% faster on 2 cores (docs/pipeline.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

TRAINER_CPUS_ENV = "AGRPO_TRAINER_CPUS"


@dataclass(frozen=True)
class CpuSplit:
    replica_cores: list[list[int]] | None  # one core list per replica; None: leave vLLM's own binding
    trainer_cores: list[int] | None  # None: the trainer is not pinned
    trainer_threads: int


def split_cpu_cores(
    cpu_ids: Sequence[int],
    replicas: int,
    cores_per_replica: int = 1,
    trainer_threads: int | None = None,
    unpinned_replicas: int = 0,
) -> CpuSplit:
    """Replica i gets `cores_per_replica` cores of its own, the trainer the rest. When no core is left for the
    trainer but there is one per replica, each replica still gets a core of its own and the trainer is not pinned:
    left on vLLM's `auto`, both replicas of a 2-core machine bound their workers to core 0, where the busy one's
    spin-wait starved the other's forward passes for 40-60 s, adapter loads included. With fewer cores than
    replicas nothing is pinned. The trainer gets what the replicas (also those started elsewhere on this machine,
    `unpinned_replicas`) leave, at least one thread."""
    cpu_ids = sorted(cpu_ids)
    needed = replicas * cores_per_replica
    if replicas and len(cpu_ids) > needed:
        replica_cores = [cpu_ids[i * cores_per_replica : (i + 1) * cores_per_replica] for i in range(replicas)]
        trainer_cores = cpu_ids[needed:]
        threads = trainer_threads or max(len(trainer_cores) - unpinned_replicas, 1)
        return CpuSplit(replica_cores, trainer_cores, threads)
    threads = trainer_threads or max(len(cpu_ids) - replicas - unpinned_replicas, 1)
    if replicas and len(cpu_ids) >= replicas:
        return CpuSplit([[core] for core in cpu_ids[:replicas]], None, threads)
    return CpuSplit(None, None, threads)


def split_fleet_cores(
    cpu_ids: Sequence[int],
    fewest: int,
    most: int,
    cores_per_replica: int = 1,
    trainer_threads: int | None = None,
    unpinned_replicas: int = 0,
) -> CpuSplit:
    """A fleet of `fewest`..`most` replicas (inference.replicas=auto): the trainer gets the thread count the `fewest`
    started ones leave, and the replica slots are those of `most` replicas, which take cores the trainer would have
    (the slots come first). So the trainer is not pinned: pinned, it could not move to the cores a slow replica
    leaves idle once a newcomer shares its own (benchmarks/elastic.py, 2 cores, replica 0 held to a quarter core:
    pinned to core 1 beside the newcomer, the trainer ran 0.33 steps/s; the fixed 2-replica fleet, unpinned, 0.86)."""
    start = split_cpu_cores(cpu_ids, fewest, cores_per_replica, trainer_threads, unpinned_replicas)
    if most == fewest:
        return start
    slots = split_cpu_cores(cpu_ids, most, cores_per_replica, trainer_threads, unpinned_replicas).replica_cores
    return CpuSplit(slots, None, start.trainer_threads)


def format_cores(cores: Sequence[int]) -> str:
    """`0,1,5`: the list format of both VLLM_CPU_OMP_THREADS_BIND and AGRPO_TRAINER_CPUS."""
    return ",".join(str(core) for core in cores)


def apply_trainer_cpus(environ: dict[str, str] | None = None) -> list[int] | None:
    """Pin this process (and the children it starts later, e.g. the rollout child) to the cores the launcher gave
    the trainer. Cores this process may not use are ignored; returns the cores applied, or None."""
    value = (os.environ if environ is None else environ).get(TRAINER_CPUS_ENV, "")
    wanted = {int(core) for core in value.split(",") if core.strip()}
    usable = sorted(wanted & os.sched_getaffinity(0)) if wanted else []
    if not usable:
        return None
    os.sched_setaffinity(0, usable)
    return usable
