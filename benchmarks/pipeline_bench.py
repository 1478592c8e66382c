"""Where does the time of an async GRPO step go? A benchmark (prints figures; asserts nothing).

In one invocation on this machine, against ONE real vLLM replica started here:
  async      the recipe as configured (max_staleness >= 1: generation overlaps training)
  lock-step  the same with trainer.max_staleness=0 (every sample must come from the current adapter, so the
             trainer waits for fresh rollouts after every weight sync)
  gen-only   agrpo's rollout worker alone (chat template, requests at the trainer's concurrency, parsing, rewards)
             with the trained adapter loaded, no trainer running: its seconds per completion token times the tokens
             an async step trained on (the trained adapter writes longer completions than the early policy)
  train-only the trainer's own time per step (forward+backward, optimizer, weight sync) in the lock-step run
and prints seconds per optimizer step, async / lock-step, and async / max(gen-only, train-only).

    python benchmarks/pipeline_bench.py --recipe smoke --steps 30 [trainer.max_staleness=2 ...]
    python benchmarks/pipeline_bench.py --steps 4 --url http://127.0.0.1:8000 --model DIR   # a running server of DIR

`--url` uses a server that is already running (CI: the test session's shared replica) instead of starting one:
its figures then include whatever else that server does, so take measured figures from a run that starts its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

from agrpo.config.compose import compose_run_config
from agrpo.config.prepare import prepare
from agrpo.inference.vllm_server import start_replica, unload_adapters
from agrpo.cpus import TRAINER_CPUS_ENV, apply_trainer_cpus, format_cores, split_cpu_cores
from agrpo.processes.ports import free_ports
from agrpo.models.resolve import prepare_model

WARMUP_STEPS = 3


def run_trainer(
    recipe: str, server_url: str, model: str, run_dir: Path, steps: int, env: dict[str, str], *overrides: str
) -> dict:
    argv = [
        sys.executable,
        "-m",
        "agrpo",
        f"+recipe={recipe}",
        "role=trainer",
        f"inference.urls=[{server_url}]",
        f"model.name_or_path={model}",
        "model.builder=null",
        f"hydra.run.dir={run_dir}",
        f"trainer.max_steps={steps}",
        "trainer.save_steps=0",
        "logger.report_to=[]",
        *overrides,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", **env})
    if result.returncode != 0:
        raise SystemExit(f"trainer run failed:\n{result.stderr[-4000:]}")
    return json.loads((run_dir / "metrics.json").read_text())


def trainer_own_time(run_dir: Path) -> float:
    """Mean forward+backward + optimizer + weight-sync seconds per step, from the run's log_history.json."""
    history = json.loads((run_dir / "log_history.json").read_text())
    per_step = [
        e.get("perf/fwd_bwd_s", 0.0) + e.get("perf/optimizer_s", 0.0) + e.get("perf/weight_sync_s", 0.0)
        for e in history
        if "perf/fwd_bwd_s" in e
    ][WARMUP_STEPS:]
    return statistics.fmean(per_step)


def generation_only(cfg, server_url: str, adapter: str, samples_per_step: int, steps: int) -> float:
    """Seconds per generated completion token of agrpo's rollout worker with the trained adapter, no trainer."""
    from rollout_timing import time_rollouts

    requests.post(
        f"{server_url}/v1/load_lora_adapter", json={"lora_name": "bench-v1", "lora_path": adapter}, timeout=120
    ).raise_for_status()
    try:
        seconds, tokens = time_rollouts(
            cfg, server_url, "bench", samples_per_step * steps, warmup=samples_per_step * WARMUP_STEPS
        )
        return seconds / tokens
    finally:
        unload_adapters(server_url, prefix="bench-")


def tokens_per_step(run_dir: Path, samples_per_step: int) -> float:
    """Completion tokens one optimizer step trained on in a run (completion lengths change as the policy learns)."""
    history = json.loads((run_dir / "log_history.json").read_text())
    lengths = [e["completions/mean_length"] for e in history if "completions/mean_length" in e]
    if not lengths:
        raise SystemExit(f"{run_dir / 'log_history.json'} has no completions/mean_length: no rollout was logged")
    # A step whose rollout figures came after its log line has none, so a short run can have no entry past the
    # warm-up: then every logged length counts.
    return statistics.fmean(lengths[WARMUP_STEPS:] or lengths) * samples_per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--url", help="a running vLLM server to use instead of starting one (needs --model)")
    parser.add_argument("--model", help="with --url: the model folder that server serves")
    parser.add_argument("overrides", nargs="*", help="config overrides for every mode, e.g. trainer.max_staleness=2")
    args = parser.parse_args()
    if bool(args.url) != bool(args.model):
        parser.error("--url and --model go together: the server's address and the model folder it serves")
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must be more than the {WARMUP_STEPS} warm-up steps it excludes")

    work = Path(tempfile.mkdtemp(prefix="agrpo-pipeline-bench-"))
    composed = compose_run_config([f"+recipe={args.recipe}", *args.overrides], output_dir=str(work / "compose"))
    model = args.model or prepare_model(composed.model)
    composed.model.name_or_path, composed.model.builder = model, None  # gen-only runs the rollout worker on this
    cfg = prepare(composed, check_environment=False)  # the typed run spec the trainer's builders take
    # The same core split as `python -m agrpo` on this machine: the replica's worker on its own cores, the trainer
    # (and agrpo's rollout worker, its child) on the rest.
    cpus = split_cpu_cores(sorted(os.sched_getaffinity(0)), 1, cfg.inference.cpu_cores_per_replica)
    trainer_env = {"OMP_NUM_THREADS": str(cpus.trainer_threads)}
    if cpus.trainer_cores:
        trainer_env[TRAINER_CPUS_ENV] = format_cores(cpus.trainer_cores)
    server = RunningServer(args.url) if args.url else start_server(model, cfg, cpus, work)
    try:
        figures = {}
        runs = {"async": [], "lock-step": ["trainer.max_staleness=0"]}
        for mode, overrides in runs.items():
            metrics = run_trainer(
                args.recipe, server.url, model, work / mode, args.steps, trainer_env, *args.overrides, *overrides
            )
            unload_adapters(server.url)
            figures[mode] = metrics["step_s_mean"]
            figures[f"{mode} reward last 5"] = metrics.get("reward_last")
        figures["train-only"] = trainer_own_time(work / "lock-step")
        apply_trainer_cpus(trainer_env)  # the worker runs where it runs in training: the trainer's cores
        samples_per_step = cfg.trainer.per_device_train_batch_size * cfg.trainer.gradient_accumulation_steps
        seconds_per_token = generation_only(
            cfg, server.url, str(work / "async" / "final_adapter"), samples_per_step, args.steps
        )
        figures["gen-only"] = seconds_per_token * tokens_per_step(work / "async", samples_per_step)
    finally:
        server.stop()
    print_figures(figures, args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


class RunningServer:
    """A server someone else started (--url): used, never stopped."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def stop(self) -> None:
        unload_adapters(self.url)  # leave it as found: no trl-policy-* of these runs


def start_server(model: str, cfg, cpus, work: Path):
    """One replica on the replica's cores, the way `python -m agrpo` starts it on this machine."""
    return start_replica(
        model,
        free_ports(1, 18900)[0],
        work / "vllm.log",
        lora_rank=cfg.inference.max_lora_rank,
        max_loras=max(cfg.trainer.max_staleness, 1) + 3,
        max_model_len=cfg.inference.max_model_len,
        cpu_cores=cpus.replica_cores[0] if cpus.replica_cores else None,
    )


def print_figures(figures: dict[str, float], args: argparse.Namespace) -> None:
    """Add the ratios to `figures` and print the table."""
    bound = max(figures["gen-only"], figures["train-only"])
    figures["async / lock-step"] = figures["async"] / figures["lock-step"]
    figures["async / max(gen, train)"] = figures["async"] / bound
    print(
        f"pipeline_bench: recipe={args.recipe} {' '.join(args.overrides)}, {args.steps} steps per mode "
        f"(first {WARMUP_STEPS} excluded), "
        f"{os.cpu_count()} CPU cores"
    )
    print("| mode | seconds per optimizer step |\n|---|---|")
    for mode in ("async", "lock-step", "gen-only", "train-only"):
        print(f"| {mode} | {figures[mode]:.3f} |")
    print(f"| async / lock-step | {figures['async / lock-step']:.2f}x |")
    print(f"| async / max(gen-only, train-only) | {figures['async / max(gen, train)']:.2f}x (target <= 1.15x) |")


if __name__ == "__main__":
    main()
