"""bf16 where the GPU has it, and the GPU stack's set-up problems, on simulated machines (no GPU needed): an H200, an
A10 (both bf16), a T4 (pre-Ampere: none), and a machine with vLLM's CUDA build but no GPU torch can see."""

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.gpu_precision import GpuFacts, flavor_has_bf16, precision_problems, stack_problems
from agrpo.config.resolve import resolve

H200 = GpuFacts(cuda=True, bf16=True, name="NVIDIA H200", capability=(9, 0), torch_cuda="13.0", vllm_cuda_build=True)
A10 = GpuFacts(cuda=True, bf16=True, name="NVIDIA A10", capability=(8, 6), torch_cuda="13.0", vllm_cuda_build=True)
T4 = GpuFacts(cuda=True, bf16=False, name="Tesla T4", capability=(7, 5), torch_cuda="13.0", vllm_cuda_build=True)
OLD_DRIVER = GpuFacts(cuda=False, torch_cuda="13.0", vllm_cuda_build=True, driver="535.104.05")
NO_DRIVER = GpuFacts(cuda=False, torch_cuda="13.0", vllm_cuda_build=True)
CPU_SETUP = GpuFacts(cuda=False, torch_cuda=None, vllm_cuda_build=False)


def cfg(*overrides):
    return compose_run_config(["+recipe=gsm8k", *overrides], output_dir="/runs/r1")


@pytest.mark.parametrize("facts", [H200, A10])
def test_gpus_with_bf16_train_and_serve_in_it(facts):
    resolved = resolve(cfg(), cuda_available=True, bf16_supported=facts.bf16)
    assert resolved.trainer.bf16 is True and str(resolved.inference.dtype) == "bfloat16"
    assert precision_problems(cfg("trainer.bf16=true"), facts) == []


def test_a_t4_falls_back_to_float32_training_and_float16_serving():
    resolved = resolve(cfg(), cuda_available=True, bf16_supported=T4.bf16)
    assert resolved.trainer.bf16 is False and str(resolved.inference.dtype) == "float16"
    assert precision_problems(cfg(), T4) == []  # the defaults: nothing to refuse


def test_bf16_forced_on_a_t4_is_refused_naming_each_key():
    problems = precision_problems(cfg("trainer.bf16=true", "inference.dtype=bfloat16"), T4)
    assert len(problems) == 2
    assert problems[0].startswith("trainer.bf16=true, but Tesla T4 (compute capability 7.5) has no bfloat16")
    assert problems[1].startswith("inference.dtype=bfloat16, but Tesla T4") and "inference.dtype=auto" in problems[1]


def test_vllms_cuda_build_without_a_visible_gpu_names_the_driver_or_its_absence():
    [old] = stack_problems(cfg(), OLD_DRIVER)
    assert "torch sees no GPU" in old and "driver here (535.104.05" in old and "CUDA 13.0" in old
    assert "(R580 or newer): update the driver" in old and "vLLM 0.31 pins torch==2.13.0" in old
    [none] = stack_problems(cfg(), NO_DRIVER)
    assert "no NVIDIA driver answers here" in none and "make clean && make setup" in none


@pytest.mark.parametrize(
    "overrides",
    [
        ("inference.device=cpu",),  # the user asked for CPU replicas
        ("role=trainer", "inference.urls=[http://10.0.0.1:8000]"),  # no replica starts here
        ("launcher=hf_jobs",),  # the replicas start as Jobs, on GPUs
    ],
)
def test_no_stack_problem_where_no_gpu_replica_starts_here(overrides):
    assert stack_problems(cfg(*overrides), OLD_DRIVER) == []


def test_the_cpu_set_up_and_a_gpu_machine_have_no_stack_problem():
    assert stack_problems(cfg(), CPU_SETUP) == [] and stack_problems(cfg(), H200) == []


@pytest.mark.parametrize(
    ("flavor", "bf16"),
    [("h200", True), ("a10g-small", True), ("l4x1", True), ("t4-medium", False), ("T4-small", False)],
)
def test_jobs_flavors_without_bf16(flavor, bf16):
    assert flavor_has_bf16(flavor) is bf16


@pytest.mark.parametrize(("cuda", "driver"), [("13.0", 580), ("12.8", 525), ("11.8", 450), (None, None), ("x", None)])
def test_the_driver_a_cuda_build_needs(cuda, driver):
    from agrpo.config.gpu_precision import driver_needed

    assert driver_needed(cuda) == driver
