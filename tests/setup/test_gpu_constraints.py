"""scripts/gpu_constraints.py: constraints/gpu-versions.txt is what the recorded `make setup-gpu` resolution renders
to, and the script's pip step reads pip's own installation report. pip cannot resolve vLLM's CUDA build on this
project's machines, so the report below is a small hand-written one in pip's report format (its `install` items)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("gpu_constraints", REPO / "scripts" / "gpu_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_constraints_are_the_rendered_resolution():
    assert script().main(["render", "--check"]) == 0


def test_rendering_keeps_agrpos_own_dependencies_and_swaps_the_cuda_builds():
    gpu = script()
    resolution = gpu.read_resolution("vllm==0.31.0\ntorch==2.13.0+cu130\nPEFT==0.21.2\nnvidia-nccl-cu13==2.28\n")
    text = gpu.render(resolution, ["peft", "torch", "vllm", "numpy"])
    lines = [line for line in text.splitlines() if line and not line.startswith("# GENERATED")]
    assert "peft==0.21.2" in lines and "torch==2.13.0" in lines  # local label dropped: +cpu installs under it
    assert not any(line.startswith(("vllm==", "nvidia")) for line in lines)  # CUDA-only: comments or left out
    assert any(line.startswith("# vllm==0.31.0: vLLM's CUDA build") for line in lines)
    assert any(line.startswith("# numpy: not in the recorded resolution") for line in lines)


def test_the_resolve_step_asks_pip_for_a_dry_run_report_of_the_gpu_set_up_and_reads_it():
    gpu = script()
    argv = gpu.pip_report_command("py", "/tmp/r.json")
    assert argv[:4] == ["py", "-m", "pip", "install"] and "--dry-run" in argv and "--ignore-installed" in argv
    assert argv[argv.index("--report") + 1] == "/tmp/r.json" and argv[-1].endswith("[gpu,test]")
    report = {
        "version": "1",
        "install": [
            {"metadata": {"name": "agrpo", "version": "0.1.0"}},
            {"metadata": {"name": "vllm", "version": "0.31.0"}},
            {"metadata": {"name": "peft", "version": "0.21.2"}},
        ],
    }
    assert gpu.report_resolution(report) == {"vllm": "0.31.0", "peft": "0.21.2"}


def test_every_dependency_agrpo_declares_is_rendered():
    gpu = script()
    names = {gpu.canonical(name) for name in gpu.own_dependencies()}
    assert {"trl", "peft", "vllm", "torch", "kernels", "huggingface-hub", "transformers"} <= names
    rendered = (REPO / "constraints" / "gpu-versions.txt").read_text()
    for name in gpu.own_dependencies():
        assert f"{name}==" in rendered or f"# {name}" in rendered, name
