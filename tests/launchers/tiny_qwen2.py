"""The 2-layer Qwen2 the FSDP2 tests shard (seeded, so both ranks build the same weights); imported by the test and
by the torchrun worker, which finds it beside itself on sys.path."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=tied,
        )
    )
