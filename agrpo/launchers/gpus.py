"""Split a machine's GPUs between the trainer and the vLLM replicas (pure)."""

from __future__ import annotations

from agrpo.errors import ConfigError


def assign_gpus(num_gpus: int, replicas: int, gpus_per_replica: int, trainer_gpus: list[int] | None,
                replica_gpus: list[int] | None) -> tuple[list[int] | None, list[list[int]] | None]:
    """Return (trainer GPUs, GPUs of each replica); (None, None) on a CPU machine.

    Defaults: replicas take the last `replicas x gpus_per_replica` GPUs, the trainer the rest. With one GPU, trainer
    and a single replica share it (the replica's gpu_memory_utilization leaves the trainer room).
    """
    if num_gpus == 0:
        return None, None
    needed = replicas * gpus_per_replica
    if replica_gpus is None:
        if num_gpus == 1 and needed == 1:
            replica_gpus = [0]
        elif needed >= num_gpus:
            raise ConfigError(
                f"{replicas} replica(s) x {gpus_per_replica} GPU(s) leave none of the {num_gpus} GPUs for the trainer: "
                "lower inference.replicas or inference.gpus_per_replica, or set inference.gpus and trainer.gpus"
            )
        else:
            replica_gpus = list(range(num_gpus - needed, num_gpus))
    if len(replica_gpus) != needed:
        raise ConfigError(f"inference.gpus lists {len(replica_gpus)} GPUs but replicas x gpus_per_replica = {needed}")
    if trainer_gpus is None:
        trainer_gpus = [gpu for gpu in range(num_gpus) if gpu not in replica_gpus] or [0]
    for gpu in [*trainer_gpus, *replica_gpus]:
        if not 0 <= gpu < num_gpus:
            raise ConfigError(f"GPU {gpu} does not exist on this machine ({num_gpus} GPUs): fix trainer.gpus / inference.gpus")
    per_replica = [replica_gpus[i * gpus_per_replica:(i + 1) * gpus_per_replica] for i in range(replicas)]
    return list(trainer_gpus), per_replica
