"""launcher=accelerate for real: two trainer ranks on CPU (gloo) against the session's vLLM server, and FSDP2 on
GPUs (marked `gpu`: a machine with 3+ GPUs runs it; accelerate enables FSDP on accelerators only; it starts its own
replica, so it is marked vllm too). Every wait is bounded below the test's own limit, so a hang fails with the run's
output rather than pytest-timeout's stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


CPU_RUN_S = 600  # under the default 900 s limit, which also holds the shared server's boot (~40 s)
GPU_RUN_S = 600  # two runs under FSDP2_LIMIT_S
FSDP2_LIMIT_S = 1500


def run_agrpo(run_dir: Path, *overrides: str, timeout: int = CPU_RUN_S) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-m",
        "agrpo",
        "+recipe=smoke",
        "launcher=accelerate",
        f"hydra.run.dir={run_dir}",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        *overrides,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )


def assert_trained(run_dir: Path, result: subprocess.CompletedProcess, steps: int) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == steps and len(metrics["rewards"]) == steps
    assert metrics["wall_time_s"] > 0
    adapter = run_dir / "final_adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert (run_dir / "accelerate_fsdp.yaml").is_file()


@pytest.mark.vllm
def test_two_cpu_ranks_train_two_steps(vllm_server, tiny_model_dir, clean_adapters, tmp_path):
    """Two trainer processes under `accelerate launch` (gloo, DDP on CPU): rank 0 generates and publishes, both
    train on their half of each step's 16 samples, the final adapter is gathered and written once."""
    run_dir = tmp_path / "run"
    result = run_agrpo(
        run_dir,
        "role=trainer",
        f"inference.urls=[{vllm_server.url}]",
        f"model.name_or_path={tiny_model_dir}",
        "model.builder=null",
        "launcher.accelerate.num_processes=2",
    )
    assert_trained(run_dir, result, steps=2)
    from safetensors.torch import load_file

    weights = load_file(run_dir / "final_adapter" / "adapter_model.safetensors")
    assert weights and all(name.count("lora_") == 1 for name in weights)  # full tensors, one set, no rank suffixes


@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.timeout(FSDP2_LIMIT_S)
@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 GPUs: 2 FSDP ranks + 1 vLLM replica")
def test_fsdp2_on_two_gpus_trains_checkpoints_and_resumes(tmp_path):
    """FSDP2 for real: 2 ranks on GPUs 0-1, the replica on GPU 2; a sharded checkpoint at step 2, then resume to 4."""
    run_dir = tmp_path / "run"
    common = ("trainer.gpus=[0,1]", "inference.gpus=[2]", "trainer.save_steps=2")
    assert_trained(run_dir, run_agrpo(run_dir, *common, timeout=GPU_RUN_S), steps=2)
    assert (run_dir / "checkpoint-2").is_dir()
    resumed = run_agrpo(run_dir, *common, "trainer.resume=true", "trainer.max_steps=4", timeout=GPU_RUN_S)
    assert_trained(run_dir, resumed, steps=4)
