"""Splitting a CPU machine's cores between vLLM replicas and the trainer (pure), and the trainer taking its share."""

import os

from agrpo.cpus import TRAINER_CPUS_ENV, apply_trainer_cpus, format_cores, split_cpu_cores, split_fleet_cores
from tests.launchers.test_local_plan import plan_for


def test_each_replica_gets_its_own_cores_and_the_trainer_the_rest():
    split = split_cpu_cores(range(8), replicas=3)
    assert split.replica_cores == [[0], [1], [2]]
    assert split.trainer_cores == [3, 4, 5, 6, 7] and split.trainer_threads == 5
    wide = split_cpu_cores([4, 5, 6, 7, 8, 9], replicas=2, cores_per_replica=2, trainer_threads=3)
    assert wide.replica_cores == [[4, 5], [6, 7]] and wide.trainer_cores == [8, 9] and wide.trainer_threads == 3


def test_replicas_never_share_a_core_while_there_is_one_each():
    # 2 cores, 2 replicas: a core per replica, the trainer unpinned (vLLM's `auto` put both workers on core 0)
    split = split_cpu_cores(range(2), replicas=2)
    assert split.replica_cores == [[0], [1]] and split.trainer_cores is None and split.trainer_threads == 1
    wide = split_cpu_cores(range(3), replicas=2, cores_per_replica=2)
    assert wide.replica_cores == [[0], [1]] and wide.trainer_cores is None


def test_nothing_is_pinned_with_fewer_cores_than_replicas():
    split = split_cpu_cores(range(2), replicas=3)
    assert split.replica_cores is None and split.trainer_cores is None and split.trainer_threads == 1
    # replicas started elsewhere on this machine (loopback URLs) leave their cores out of the trainer's threads
    outside = split_cpu_cores(range(8), replicas=0, unpinned_replicas=2)
    assert outside.trainer_cores is None and outside.trainer_threads == 6


def test_the_plan_binds_replica_workers_and_pins_the_trainer():
    plan = plan_for("inference.replicas=2", cpu_count=4)
    replicas = [s for s in plan.services if s.role == "replica"]
    assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in replicas] == ["0", "1"]
    assert plan.trainer.env[TRAINER_CPUS_ENV] == "2,3" and plan.trainer.env["OMP_NUM_THREADS"] == "2"
    gpu = plan_for(device="cuda", num_gpus=2, cpu_count=4)
    assert TRAINER_CPUS_ENV not in gpu.trainer.env
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in s.env for s in gpu.services)


def test_the_trainer_pins_itself_to_usable_cores_only():
    before = os.sched_getaffinity(0)
    try:
        usable = sorted(before)
        assert apply_trainer_cpus({TRAINER_CPUS_ENV: format_cores([usable[-1], 100_000])}) == [usable[-1]]
        assert os.sched_getaffinity(0) == {usable[-1]}
        assert apply_trainer_cpus({TRAINER_CPUS_ENV: "100000"}) is None  # none usable: left alone
        assert apply_trainer_cpus({}) is None
    finally:
        os.sched_setaffinity(0, before)


def test_a_growing_fleet_leaves_the_trainer_unpinned():
    # the later replicas' slots are cores the trainer would be pinned to: unpinned, it can use what a slow replica
    # leaves idle; its thread count is what the replicas started first leave
    small = split_fleet_cores(range(2), fewest=1, most=2)
    assert small.replica_cores == [[0], [1]] and small.trainer_cores is None and small.trainer_threads == 1
    roomy = split_fleet_cores(range(8), fewest=1, most=3)
    assert roomy.replica_cores == [[0], [1], [2]] and roomy.trainer_cores is None and roomy.trainer_threads == 7
    fixed = split_fleet_cores(range(8), fewest=2, most=2)
    assert fixed.trainer_cores == [2, 3, 4, 5, 6, 7]  # a fixed fleet keeps the trainer on its own cores
