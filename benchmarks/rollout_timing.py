"""agrpo's rollout worker timed alone: the generation side of the pipeline, for benchmarks/pipeline_bench.py's
"gen-only" mode (kept out of agrpo.trainer.trl_backend, which holds the trainer integration only)."""

from __future__ import annotations

import time

from agrpo.config.schema import RunConfig
from agrpo.trainer.trl_backend import build_grpo_args, cuda_available, load_tokenizer


def time_rollouts(cfg: RunConfig, vllm_url: str, lora_name: str, samples: int, warmup: int) -> tuple[float, int]:
    """(seconds, completion tokens) of agrpo's rollout worker (the generation side of the pipeline: chat template,
    /v1/completions, response parsing, rewards) delivering `samples` scored samples, with no trainer running. It
    requests the adapter `<lora_name>-v1`, which the caller has loaded. benchmarks/pipeline_bench.py: "gen-only"."""
    import queue

    from agrpo.data import load_train_dataset
    from agrpo.rewards.registry import build_reward_funcs
    from agrpo.trainer.seam.module_patches import apply_trl_patches

    apply_trl_patches()
    from transformers import AutoTokenizer

    from agrpo.trainer.rollout.worker import AgrpoRolloutWorker, loop_arguments

    args = build_grpo_args(cfg, vllm_url, 1, cuda_available())
    tokenizer = load_tokenizer(cfg.model) or AutoTokenizer.from_pretrained(
        cfg.model.name_or_path, trust_remote_code=cfg.model.trust_remote_code
    )
    dataset = load_train_dataset(cfg.data, seed=cfg.trainer.seed)
    settings = loop_arguments(args, dataset, build_reward_funcs(cfg.reward.funcs), None, None)
    worker = AgrpoRolloutWorker(settings, queue_maxsize=args.queue_maxsize)  # no trainer: no guard's run dir
    worker.bind(
        model_name=cfg.model.name_or_path,
        lora_name=lora_name,
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
    )
    worker.update_model_version(1)
    worker.start()
    try:
        for _ in range(warmup):
            worker.rollout_buffer.get(timeout=600)
        try:  # drain what piled up while nobody consumed, so the clock sees the steady production rate only
            while True:
                worker.rollout_buffer.get_nowait()
        except queue.Empty:
            pass
        started, tokens = time.perf_counter(), 0
        for _ in range(samples):
            tokens += int(worker.rollout_buffer.get(timeout=600).completion_mask.sum())
        return time.perf_counter() - started, tokens
    finally:
        worker.stop()
