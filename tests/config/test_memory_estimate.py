"""The trainer's memory estimate (agrpo/config/memory_estimate.py) on Qwen2.5-0.5B-Instruct's published config.json
values (written here: nothing is downloaded), the gsm8k recipe's model: what its card says it needs."""

import json

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.gpu_precision import GpuFacts, trainer_memory_problems
from agrpo.config.memory_estimate import GIB, estimate, main, parameter_count

QWEN2_5_0_5B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
A10 = GpuFacts(cuda=True, bf16=True, name="NVIDIA A10", capability=(8, 6), memory_bytes=24 * GIB)
H200 = GpuFacts(cuda=True, bf16=True, name="NVIDIA H200", capability=(9, 0), memory_bytes=141 * GIB)


def test_the_parameter_count_is_the_models_own():
    assert parameter_count(QWEN2_5_0_5B) == pytest.approx(494e6, rel=0.02)  # Qwen's model card: 0.49B


def test_gradient_checkpointing_cuts_the_activations_the_knob_names():
    off = estimate(QWEN2_5_0_5B, 16384, 2, checkpointing=False)
    on = estimate(QWEN2_5_0_5B, 16384, 2, checkpointing=True)
    assert off.activations > 10 * on.activations and off.weights == on.weights and off.logits == on.logits
    assert 30 * GIB < off.total < 60 * GIB  # gsm8k's 16,384 tokens without checkpointing: not a 24 GB GPU
    assert on.logits > 10 * GIB  # ...nor with it: 16,384 tokens x 151,936 scores dominate; a smaller budget fits
    assert estimate(QWEN2_5_0_5B, 8192, 2, checkpointing=True).total < 24 * GIB * 0.65


def test_the_gsm8k_recipe_on_a_24_gb_gpu_is_refused_naming_the_knobs_and_fits_an_h200():
    cfg = compose_run_config(["+recipe=gsm8k"], output_dir="/r")
    [problem] = trainer_memory_problems(cfg, A10, QWEN2_5_0_5B)
    assert "16,384 tokens a micro-step" in problem and "GPU 0 (NVIDIA A10, 24.0 GiB) would hold" in problem
    assert "trainer.gradient_checkpointing=true" in problem and "trainer.token_budget" in problem
    assert trainer_memory_problems(cfg, H200, QWEN2_5_0_5B) == []
    smaller = ["+recipe=gsm8k", "trainer.gradient_checkpointing=true", "trainer.token_budget=8192"]
    assert trainer_memory_problems(compose_run_config(smaller, output_dir="/r"), A10, QWEN2_5_0_5B) == []


def test_the_estimate_prints_for_a_recipe(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    main(["+recipe=gsm8k", f"model.name_or_path={tmp_path}"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("trainer memory estimate: ~") and "16,384 tokens" in line and "checkpointing off" in line


def test_the_estimate_composes_with_this_users_runtime_dir_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """No fixed /tmp name (another user could take it first): the stand-in run dir is under this user's runtime base."""
    from agrpo.config.compose import estimate_run_dir

    monkeypatch.setenv("AGRPO_RUNTIME_DIR", str(tmp_path / "runtime"))
    assert estimate_run_dir() == str(tmp_path / "runtime" / "estimate")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    main(["+recipe=gsm8k", f"model.name_or_path={model}"])
    assert capsys.readouterr().out.startswith("trainer memory estimate")
    assert not (tmp_path / "runtime").exists()
