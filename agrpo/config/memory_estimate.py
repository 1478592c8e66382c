"""How much GPU memory the trainer needs for one optimizer micro-step, estimated from the model's config.json (pure).

An estimate, erring high, to say before a launch what a recipe needs and which knob moves it (issue 33: the gsm8k
recipe's "one 24 GB GPU" did not hold for 16,384 tokens without gradient checkpointing). Per packed row of
`trainer.token_budget` tokens, in the training dtype (2 bytes in bf16/fp16, 4 in fp32):
- weights: every parameter once (LoRA's own and its Adam states are a few MB, counted in the margin);
- activations kept for the backward pass: without gradient checkpointing, each layer keeps about 10 hidden-size and
  3 MLP-size tensors per token (q, k, v, attention output, norms, residuals; gate, up, activation); with it, only each
  layer's input plus one layer's full set;
- logits: the vocabulary's scores per token, in the dtype and once more in float32 for the log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3
MARGIN = 1.10  # CUDA context, allocator fragmentation, LoRA and its optimizer states


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float  # bytes
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return (self.weights + self.activations + self.logits) * MARGIN

    def line(self, tokens: int, checkpointing: bool) -> str:
        return (
            f"trainer memory estimate: ~{self.total / GIB:.1f} GiB for {tokens:,} tokens a micro-step "
            f"(weights {self.weights / GIB:.1f}, activations {self.activations / GIB:.1f}, logits "
            f"{self.logits / GIB:.1f}; gradient checkpointing {'on' if checkpointing else 'off'})"
        )


def parameter_count(config: dict[str, Any]) -> int | None:
    """A decoder's parameters from config.json: embeddings (twice unless tied), attention with its KV heads, MLP."""
    try:
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        vocab, inter = int(config["vocab_size"]), int(config.get("intermediate_size") or 4 * hidden)
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return embeddings + layers * (attention + 3 * hidden * inter)


def estimate(config: dict[str, Any], tokens: int, dtype_bytes: int, checkpointing: bool) -> MemoryEstimate | None:
    params = parameter_count(config)
    if params is None:
        return None
    hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    inter = int(config.get("intermediate_size") or 4 * hidden)
    per_layer = (10 * hidden + 3 * inter) * dtype_bytes  # per token
    if checkpointing:
        activations = tokens * (layers * hidden * dtype_bytes + per_layer)
    else:
        activations = tokens * layers * per_layer
    return MemoryEstimate(params * dtype_bytes, activations, tokens * vocab * (dtype_bytes + 4))


def trainer_tokens(trainer: Any, max_model_len: int) -> int:
    """Tokens in one micro-step: the packed budget, or a row per sample of the longest length."""
    if trainer.token_budget:
        return int(trainer.token_budget)
    return int(trainer.per_device_train_batch_size) * int(max_model_len)


def memory_problem(estimated: MemoryEstimate, gpu_bytes: float, gpu_name: str, tokens: int, share: float) -> str | None:
    """Refuse only what cannot fit (the estimate errs high): more than the GPU's memory left to the trainer."""
    room = gpu_bytes * (1.0 - share)
    if estimated.total <= room:
        return None
    shared = f", less the replica's {share:.0%} it shares" if share else ""
    return (
        f"the trainer needs ~{estimated.total / GIB:.0f} GiB for {tokens:,} tokens a micro-step (weights "
        f"{estimated.weights / GIB:.1f}, activations {estimated.activations / GIB:.1f}, logits "
        f"{estimated.logits / GIB:.1f} GiB: an estimate) but {gpu_name} has {room / GIB:.0f} GiB for it "
        f"({gpu_bytes / GIB:.0f} GiB{shared}): set trainer.gradient_checkpointing=true, lower trainer.token_budget, "
        "or give the trainer a GPU of its own"
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m agrpo.config.memory_estimate +recipe=gsm8k [overrides]`: the trainer's estimate for a recipe, from the
    model's config.json where this machine has it (a folder or the Hub cache; nothing is downloaded)."""
    import sys

    from agrpo.config.compose import compose_overrides, estimate_run_dir
    from agrpo.config.vllm_checks import local_model_config

    cfg = compose_overrides(list(sys.argv[1:] if argv is None else argv), output_dir=estimate_run_dir())
    config = local_model_config(cfg.model.name_or_path)
    if config is None:
        raise SystemExit(f"no config.json for {cfg.model.name_or_path} on this machine (a folder or the Hub cache)")
    tokens = trainer_tokens(cfg.trainer, cfg.inference.max_model_len)
    checkpointing = bool(cfg.trainer.gradient_checkpointing)
    dtype_bytes = 4 if cfg.trainer.bf16 is False else 2
    print(estimate(config, tokens, dtype_bytes, checkpointing).line(tokens, checkpointing))


if __name__ == "__main__":
    main()
