"""Where does the time of an async GRPO step go? A benchmark (prints figures; asserts nothing).

In one invocation on this machine, against ONE real vLLM replica started here:
  async      the recipe as configured (max_staleness >= 1: generation overlaps training)
  lock-step  the same with trainer.max_staleness=0 (every sample must come from the current adapter, so the
             trainer waits for fresh rollouts after every weight sync)
  gen-only   one step's worth of completions generated directly against the replica (same prompts, G, max_tokens,
             concurrency = requests in flight), with the trained adapter loaded, no trainer running
  train-only the trainer's own time per step (forward+backward, optimizer, weight sync) in the lock-step run
and prints seconds per optimizer step, async / lock-step, and async / max(gen-only, train-only).

    python benchmarks/pipeline_bench.py --recipe smoke --steps 30
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from agrpo.config.compose import compose_run_config
from agrpo.inference.vllm_server import served_lora_rank, start_replica, unload_adapters
from agrpo.launchers.ports import free_ports
from agrpo.models.resolve import prepare_model

WARMUP_STEPS = 3


def run_trainer(recipe: str, server_url: str, model: str, run_dir: Path, steps: int, *overrides: str) -> dict:
    argv = [sys.executable, "-m", "agrpo", f"+recipe={recipe}", "role=trainer", f"inference.urls=[{server_url}]",
            f"model.name_or_path={model}", "model.builder=null", f"hydra.run.dir={run_dir}",
            f"trainer.max_steps={steps}", "trainer.save_steps=0", "logger.report_to=[]", *overrides]
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        raise SystemExit(f"trainer run failed:\n{result.stderr[-4000:]}")
    return json.loads((run_dir / "metrics.json").read_text())


def trainer_own_time(run_dir: Path) -> float:
    """Mean forward+backward + optimizer + weight-sync seconds per step, from the run's log_history.json."""
    history = json.loads((run_dir / "log_history.json").read_text())
    per_step = [e.get("perf/fwd_bwd_s", 0.0) + e.get("perf/optimizer_s", 0.0) + e.get("perf/weight_sync_s", 0.0)
                for e in history if "perf/fwd_bwd_s" in e][WARMUP_STEPS:]
    return statistics.fmean(per_step)


def generation_only(cfg, server_url: str, adapter: str, steps: int) -> float:
    """Seconds to generate one step's worth of completions with the adapter, at the trainer's concurrency."""
    from transformers import AutoTokenizer

    from agrpo.data import load_train_dataset
    from agrpo.trainer.trl_backend import scaled_inflight

    requests.post(f"{server_url}/v1/load_lora_adapter", json={"lora_name": "bench", "lora_path": adapter},
                  timeout=120).raise_for_status()
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    prompts = load_train_dataset(cfg.data, seed=0)["prompt"]
    trainer = cfg.trainer
    per_step = trainer.per_device_train_batch_size
    inflight = scaled_inflight(trainer, 1)

    def one(index: int) -> None:
        prompt = prompts[(index // trainer.num_generations) % len(prompts)]
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False)
        body = {"model": "bench", "prompt": ids, "max_tokens": trainer.max_completion_length, "n": 1,
                "temperature": trainer.temperature, "logprobs": 0, "return_token_ids": True}
        requests.post(f"{server_url}/v1/completions", json=body, timeout=600).raise_for_status()

    with concurrent.futures.ThreadPoolExecutor(max_workers=inflight) as pool:
        list(pool.map(one, range(per_step * WARMUP_STEPS)))
        start = time.perf_counter()
        list(pool.map(one, range(per_step * steps)))
        elapsed = time.perf_counter() - start
    requests.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": "bench"}, timeout=60)
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agrpo-pipeline-bench-"))
    cfg = compose_run_config([f"+recipe={args.recipe}"], output_dir=str(work / "compose"))
    model = prepare_model(cfg.model)
    port = free_ports(1, 18900)[0]
    server = start_replica(model, port, work / "vllm.log", lora_rank=served_lora_rank(cfg),
                           max_loras=max(cfg.trainer.max_staleness, 1) + 3, max_model_len=cfg.inference.max_model_len)
    try:
        figures = {}
        runs = {"async": [], "lock-step": ["trainer.max_staleness=0"]}
        for mode, overrides in runs.items():
            metrics = run_trainer(args.recipe, server.url, model, work / mode, args.steps, *overrides)
            unload_adapters(server.url)
            figures[mode] = metrics["step_s_mean"]
            figures[f"{mode} reward last 5"] = metrics.get("reward_last")
        figures["train-only"] = trainer_own_time(work / "lock-step")
        figures["gen-only"] = generation_only(cfg, server.url, str(work / "async" / "final_adapter"), args.steps)
    finally:
        server.stop()
    bound = max(figures["gen-only"], figures["train-only"])
    figures["async / lock-step"] = figures["async"] / figures["lock-step"]
    figures["async / max(gen, train)"] = figures["async"] / bound
    print(f"pipeline_bench: recipe={args.recipe}, {args.steps} steps per mode (first {WARMUP_STEPS} excluded), "
          f"{os.cpu_count()} CPU cores")
    print("| mode | seconds per optimizer step |\n|---|---|")
    for mode in ("async", "lock-step", "gen-only", "train-only"):
        print(f"| {mode} | {figures[mode]:.3f} |")
    print(f"| async / lock-step | {figures['async / lock-step']:.2f}x |")
    print(f"| async / max(gen-only, train-only) | {figures['async / max(gen, train)']:.2f}x (target <= 1.15x) |")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
