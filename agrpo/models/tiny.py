"""Build a tiny Qwen2 model and a byte-level tokenizer offline, for tests and the smoke recipe.

Nothing is downloaded: the tokenizer is assembled with `tokenizers` (256 byte tokens plus the three Qwen special
tokens, no merges) and carries TRL's own Qwen2.5 chat template, which TRL recognises when it parses responses. The
model uses head size 32, the smallest that vLLM's CPU attention accepts. The folder is loadable by transformers, peft
and vLLM alike, and building it is deterministic for a given seed.
"""

from __future__ import annotations

import os
from pathlib import Path

from agrpo.models.folder import folder_matches, save_model_folder

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER = "agrpo_tiny.json"  # written last: a folder without it is an interrupted build


def build_tokenizer():
    """A byte-level tokenizer (every string encodes) with Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    byte_alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(byte_alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def build_tiny_model(
    output_dir: str | os.PathLike,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 2048,
    head_scale: float = 5.0,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen2ForCausalLM + tokenizer to ``output_dir`` (reused when already complete) and return it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    output_dir = Path(output_dir).expanduser().resolve()
    spec = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        head_scale=head_scale,
        seed=seed,
    )
    if folder_matches(output_dir, MARKER, spec):
        return output_dir
    if hidden_size // num_heads != 32:
        raise ValueError("vLLM's CPU attention needs a supported head size: keep hidden_size / num_heads == 32")

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # Why: with the usual 0.02 init the logits are nearly uniform, and a decoder LoRA cannot widen them (the final
        # RMSNorm fixes the hidden norm, lm_head is frozen): GRPO could raise a token class at most ~1.7x, which the
        # smoke task hit at 60 steps whatever the learning rate. A 5x head keeps sampling diverse (entropy 4.9 of 5.6
        # nats) and lets the policy move visibly.
        model.lm_head.weight.mul_(head_scale)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    return save_model_folder(model, tokenizer, output_dir, MARKER, spec)


def main() -> None:
    """`python -m agrpo.models.tiny DIR`: build the tiny model once, e.g. before starting a server by hand."""
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "outputs/tiny-model"))


if __name__ == "__main__":
    main()
