"""The trainer half on one GPU: TRL's AsyncGRPOTrainer with agrpo's patches, fed synthetic rollouts, per attention.

No vLLM, no network: the rollouts come from an in-process worker (TRL's RolloutWorkerProtocol) that makes groups of
`num_generations` samples sharing a prompt, as a real run's tree packing sees them, and the weight sync is a no-op
(TRL's WeightTransferProtocol); the model is a Qwen2 built in code. Each arm runs in its own process (attention is
patched process-wide) and reports TRL's own perf/* figures after a warm-up:

    python benchmarks/gpu_check.py [--preset qwen0.5b|tiny] [--steps 20] [--warmup 3] [--json OUT]

Arms: FA3 bf16 (TRL's Hub kernel, only where agrpo's attention choice says it can run), SDPA bf16, SDPA fp32. On a
machine without CUDA it falls back to the CPU (tiny preset, the fp32 arm), so its plumbing is tested anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRESETS = {
    # Qwen2.5-0.5B's shape (head size 64, GQA 14/2), untied head; random weights.
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, prompt=128,
                     completion=512, samples=32, token_budget=16384),
    # CPU plumbing check: seconds per step.
    "tiny": dict(hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256, vocab=1024, prompt=16, completion=24,
                 samples=8, token_budget=512),
}  # fmt: skip
ARMS = {  # name -> (trainer.attention, bf16)
    "fa3-bf16": ("fa3", True),
    "sdpa-bf16": ("sdpa", True),
    "sdpa-fp32": ("sdpa", False),
}
PERF_KEYS = ("perf/step_s", "perf/trained_tok_s_wall_clock", "perf/forwarded_tok_s_fwd_bwd", "perf/fwd_bwd_s")


def build_model(folder: Path, preset: dict, device: str) -> Path:
    """A random Qwen2 of the preset's shape with agrpo's offline byte-level tokenizer (Qwen2.5 chat template)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agrpo.models.tiny import build_tokenizer

    if (folder / "config.json").is_file():
        return folder
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=max(preset["vocab"], len(tokenizer)),
        hidden_size=preset["hidden"],
        intermediate_size=preset["intermediate"],
        num_hidden_layers=preset["layers"],
        num_attention_heads=preset["heads"],
        num_key_value_heads=preset["kv_heads"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B parameters on the GPU takes a second, not a minute
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class SyntheticRollouts:
    """TRL's RolloutWorkerProtocol without vLLM: scored samples, groups of `group` completions sharing a prompt,
    tagged with the live policy version so none is dropped as stale."""

    def __init__(self, preset: dict, group: int, tokens: int, seed: int = 0):
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=4 * preset["samples"])
        self.metrics_queue: queue.Queue = queue.Queue()
        self.preset, self.group, self.tokens, self.seed = preset, group, tokens, seed
        self.version = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, daemon=True, name="synthetic-rollouts")

    def _fill(self) -> None:
        import numpy as np

        RolloutSample = self._sample_type
        rng = np.random.default_rng(self.seed)
        group_id = 0
        while not self._stop.is_set():
            prompt = rng.integers(0, self.tokens, self.preset["prompt"])
            advantages = rng.standard_normal(self.group)
            for advantage in (advantages - advantages.mean()) / (advantages.std() + 1e-6):
                length = int(rng.integers(self.preset["completion"] // 2, self.preset["completion"] + 1))
                ids = np.concatenate([prompt, rng.integers(0, self.tokens, length)])
                mask = np.concatenate([np.zeros(len(prompt), np.int64), np.ones(length, np.int64)])
                sample = RolloutSample(
                    prompt=[{"role": "user", "content": ""}],
                    completion=[{"role": "assistant", "content": ""}],
                    input_ids=ids.astype(np.int64),
                    completion_mask=mask,
                    old_log_probs=(mask * -float(np.log(self.tokens))).astype(np.float32),
                    advantage=float(advantage),
                    model_version=self.version,
                    group_id=group_id,
                    metrics={"reward": float(advantage)},
                    enqueued_at=time.time(),
                )
                while not self._stop.is_set():
                    try:
                        self.rollout_buffer.put(sample, timeout=0.1)
                        break
                    except queue.Full:
                        continue
            group_id += 1

    def start(self) -> None:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        self._sample_type = RolloutSample  # imported here: an import error in the thread would only starve the trainer
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def update_model_version(self, model_version: int) -> None:
        self.version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("synthetic rollouts stopped")


class NoWeightTransfer:
    """TRL's WeightTransferProtocol as a no-op: the merged weights are streamed (and counted), sent nowhere."""

    def init_weight_transfer(self) -> None: ...

    def pause(self) -> None: ...

    def send_weights(self, iterator) -> None:
        for _ in iterator:
            pass

    def resume(self) -> None: ...

    def destroy(self) -> None: ...


def run_arm(arm: str, preset_name: str, steps: int, warmup: int, work: Path) -> dict:
    """One arm in this process: agrpo's attention choice and TRL patches, then `warmup + steps` optimizer steps."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from agrpo.config.schema import RunConfig
    from agrpo.config.spec import with_values
    from agrpo.config.attention_choice import choose_attention, gather_facts
    from agrpo.trainer.seam.module_patches import apply_trl_patches

    requested, bf16 = ARMS[arm]
    cuda = torch.cuda.is_available()
    preset = PRESETS[preset_name]
    row = {"arm": arm, "preset": preset_name, "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    if bf16 and not cuda:
        return {**row, "skipped": "bf16 arms run on a GPU only"}
    cfg = with_values(RunConfig(), {"trainer.bf16": bf16, "trainer.attention": requested})
    choice = choose_attention(requested, gather_facts(cfg))
    row["attention"] = choice.banner
    if choice.problem:
        return {**row, "skipped": choice.problem}
    apply_trl_patches(choice.kind)
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    model = build_model(work / f"model-{preset_name}", preset, "cuda" if cuda else "cpu")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    group = 8
    args = AsyncGRPOConfig(
        output_dir=str(work / f"run-{arm}"), vllm_server_base_url="http://127.0.0.1:9", max_steps=warmup + steps,
        per_device_train_batch_size=preset["samples"], num_generations=group,
        max_completion_length=preset["completion"], token_budget=preset["token_budget"], bf16=bf16,
        dtype="float32", learning_rate=1e-5, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
        max_staleness=10_000, weight_sync_steps=10_000, use_cpu=not cuda, seed=0,
    )  # fmt: skip
    trainer = AsyncGRPOTrainer(
        model=str(model),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * 64}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        rollout_worker=SyntheticRollouts(preset, group, len(tokenizer)),
        weight_transfer=NoWeightTransfer(),
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    trainer.train()
    row.update(measured_steps(trainer.state.log_history, steps))
    row["wall_s"] = time.monotonic() - started
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return row


def measured_steps(log_history: list[dict], steps: int) -> dict:
    """Each perf figure's mean over the last `steps` logged steps (after the warm-up), and whether the loss stayed
    finite."""
    logged = [entry for entry in log_history if "perf/step_s" in entry][-steps:]
    figures = {}
    for key in PERF_KEYS:
        values = [entry[key] for entry in logged if key in entry]
        figures[key] = sum(values) / len(values) if values else None
    losses = [entry["loss"] for entry in logged if "loss" in entry]
    figures["loss_finite"] = bool(losses) and all(v == v and abs(v) != float("inf") for v in losses)
    figures["steps_measured"] = len(logged)
    return figures


def table(rows: list[dict]) -> str:
    head = (
        f"{'arm':<10} {'steps/s':>8} {'trained tok/s':>14} {'fwd+bwd tok/s':>14} {'peak GiB':>9} {'loss ok':>7}  note"
    )
    lines = [head, "-" * len(head)]
    for row in rows:
        if "skipped" in row or "error" in row:
            lines.append(
                f"{row['arm']:<10} {'-':>8} {'-':>14} {'-':>14} {'-':>9} {'-':>7}  {row.get('skipped') or row['error']}"
            )
            continue
        step = row.get("perf/step_s")
        peak = f"{row['peak_gib']:.1f}" if row.get("peak_gib") is not None else "-"
        lines.append(
            f"{row['arm']:<10} {1 / step if step else float('nan'):>8.2f} "
            f"{row.get('perf/trained_tok_s_wall_clock') or float('nan'):>14,.0f} "
            f"{row.get('perf/forwarded_tok_s_fwd_bwd') or float('nan'):>14,.0f} {peak:>9} "
            f"{'yes' if row.get('loss_finite') else 'NO':>7}  {row.get('attention', '')}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), help="default: qwen0.5b on a GPU, tiny on CPU")
    parser.add_argument("--steps", type=int, default=20, help="measured optimizer steps per arm")
    parser.add_argument("--warmup", type=int, default=3, help="steps not counted (compilation, allocator)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--json", help="write every arm's figures here")
    parser.add_argument("--work", help="folder for the model and run dirs (default: a temporary one)")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run this one arm and print its row as JSON
    args = parser.parse_args(argv)
    import torch

    preset = args.preset or ("qwen0.5b" if torch.cuda.is_available() else "tiny")
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.arm:
        print("ROW " + json.dumps(run_arm(args.arm, preset, args.steps, args.warmup, work)), flush=True)
        return 0
    rows = []
    for arm in args.arms.split(","):
        if ARMS[arm][1] and not torch.cuda.is_available():
            rows.append({"arm": arm, "skipped": "bf16 arms run on a GPU only"})  # no process needed to say so
            continue
        command = [sys.executable, __file__, "--arm", arm, "--preset", preset, "--work", str(work),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        (work / f"{arm}.log").write_text(done.stdout + done.stderr)
        found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        row = json.loads(found[-1]) if found else {"arm": arm, "error": f"{last} (log: {work / f'{arm}.log'})"}
        row["process_s"] = time.monotonic() - started
        rows.append(row)
        print(f"gpu_check: {arm} done in {row['process_s']:.0f} s", file=sys.stderr, flush=True)
    print(f"gpu_check: trainer half, preset {preset}, {args.steps} measured steps per arm (TRL's perf/* figures)")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if any("perf/step_s" in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
