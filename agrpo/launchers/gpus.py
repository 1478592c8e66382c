"""Split a machine's GPUs between the trainer and the vLLM replicas, and name them for the children (pure).

Indices in the config (trainer.gpus, inference.gpus) count the GPUs this run may use, as torch does: with
CUDA_VISIBLE_DEVICES=2,3 set by the user or a scheduler, index 0 is the machine's GPU 2. Children get the
machine's ids (`to_physical`).
"""

from __future__ import annotations

from agrpo.errors import ConfigError


def assign_gpus(
    num_gpus: int, replicas: int, gpus_per_replica: int, trainer_gpus: list[int] | None, replica_gpus: list[int] | None
) -> tuple[list[int] | None, list[list[int]] | None]:
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
            raise ConfigError(
                f"GPU {gpu} does not exist on this machine ({num_gpus} GPUs): fix trainer.gpus / inference.gpus"
            )
    per_replica = [replica_gpus[i * gpus_per_replica : (i + 1) * gpus_per_replica] for i in range(replicas)]
    return list(trainer_gpus), per_replica


def one_process_trainer_gpus(
    trainer_gpus: list[int] | None, launcher: str, explicit: bool
) -> tuple[list[int] | None, str | None]:
    """The GPUs of a trainer that runs as ONE process (every launcher but accelerate), and a plan note on the GPUs
    left idle. One process handed several GPUs is wrapped by transformers in `nn.DataParallel`, which splits TRL's
    packed arguments across the GPUs while `input_ids` stays whole: it never trains right. So such a trainer gets
    the first of its GPUs; set explicitly to several, it is refused naming the launcher that uses them all."""
    if trainer_gpus is None or len(trainer_gpus) <= 1 or launcher == "accelerate":
        return trainer_gpus, None
    if explicit:
        raise ConfigError(
            f"trainer.gpus={list(trainer_gpus)} gives the trainer {len(trainer_gpus)} GPUs, but launcher={launcher} "
            "trains in one process (transformers would wrap the model in nn.DataParallel, which splits TRL's packed "
            "batches wrongly): use launcher=accelerate to train on all of them (one rank per GPU), or give "
            "trainer.gpus one GPU"
        )
    idle = list(trainer_gpus[1:])
    note = (
        f"GPU(s) {idle} stay idle: launcher={launcher} trains in one process on GPU {trainer_gpus[0]}; "
        "launcher=accelerate trains on all of them, or more inference.replicas serve on them"
    )
    return [trainer_gpus[0]], note


def visible_devices(cuda_visible_devices: str | None) -> list[str] | None:
    """The parent's CUDA_VISIBLE_DEVICES as a list of device ids (indices, or GPU-/MIG- UUIDs); None when unset, so
    GPU indices are physical. CUDA reads the list up to the first invalid entry, and so do we."""
    if cuda_visible_devices is None:
        return None
    devices = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        devices.append(entry)
    return devices


def to_physical(gpus: list[int] | None, visible: list[str] | None) -> list[int | str] | None:
    """The devices a child must be given for the parent's GPU indices `gpus` (0..N-1 as torch counts them here).

    A child's CUDA_VISIBLE_DEVICES is read against the whole machine, not against the parent's list: with the
    parent limited to "2,3", index 1 is the machine's GPU 3, so the child must get "3", not "1".
    """
    if gpus is None or visible is None:
        return gpus
    physical = []
    for gpu in gpus:
        if not 0 <= gpu < len(visible):
            raise ConfigError(
                f"GPU {gpu} is not among the {len(visible)} GPU(s) CUDA_VISIBLE_DEVICES="
                f"{','.join(visible)} lets this run use: fix trainer.gpus / inference.gpus"
            )
        physical.append(int(visible[gpu]) if visible[gpu].isdigit() else visible[gpu])
    return physical
