"""vLLM's start-up constraints checked in the one validation pass (agrpo/config/vllm_checks.py): each breakable one
refused with a message naming the key, the shipped recipes accepted, and the CLI exiting 2 before any replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.validate import find_problems
from agrpo.config.vllm_checks import derived_max_length, flag_values, vllm_model_problems, vllm_problems


def smoke(*overrides):
    return compose_run_config(["+recipe=smoke", *overrides])


def test_flag_values_reads_both_spellings_and_bare_flags():
    assert flag_values(["--max-cpu-loras", "12", "--enforce-eager", "--max-num-seqs=8", 3]) == {
        "--max-cpu-loras": "12",
        "--enforce-eager": None,
        "--max-num-seqs": "8",
    }


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # The sanity recipe's fixed --max-cpu-loras 12 against max_staleness + 2 slots.
        (["+recipe=sanity", "trainer.max_staleness=11"], "sets --max-cpu-loras 12, below --max-loras 13 (trainer."),
        (["+recipe=smoke", "inference.max_loras=6", "inference.extra_args=[--max-cpu-loras,4]"], "(inference.max_loras)"),
        (["+recipe=smoke", "inference.max_lora_rank=12"], "inference.max_lora_rank=12 must be one of vLLM's"),
        (["+recipe=smoke", "inference.dtype=fp32"], "inference.dtype='fp32' must be one of vLLM's"),
        (["+recipe=smoke", "inference.extra_args=[--max-loras,9]"], "sets --max-loras, which agrpo derives from"),
        (["+recipe=smoke", "inference.extra_args=['--max-model-len=4096']"], "derives from inference.max_model_len"),
        (["+recipe=smoke", "inference.device=cpu", "inference.extra_args=[--max-num-batched-tokens,64]"],
         "--max-num-batched-tokens 64, below inference.max_model_len"),
        (["+recipe=smoke", "inference.extra_args=[--max-num-batched-tokens,300,--max-num-seqs,512]"],
         "--max-num-batched-tokens 300 below --max-num-seqs 512"),
        (["+recipe=smoke", "inference.extra_args=[--max-cpu-loras,0]"], "sets --max-cpu-loras 0, below --max-loras"),
        # no --max-num-seqs: vLLM's default on the device (128 on CPU, 256 and more on a GPU)
        (["+recipe=gsm8k", "inference.device=cuda", "inference.extra_args=[--max-num-batched-tokens,200]"],
         "--max-num-batched-tokens 200 below vLLM's default --max-num-seqs 256 on this device"),
        (["+recipe=smoke", "inference.device=cpu", "inference.max_model_len=64",
          "inference.extra_args=[--max-num-batched-tokens,100]"], "below vLLM's default --max-num-seqs 128"),
    ],
)  # fmt: skip
def test_each_breakable_vllm_constraint_is_refused_naming_the_key(overrides, expected):
    problems = find_problems(compose_run_config(overrides))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("recipe", ["smoke", "gsm8k", "gsm8k_cpu", "sanity"])
def test_shipped_recipes_pass(recipe):
    assert vllm_problems(compose_run_config([f"+recipe={recipe}"])) == []


def test_enough_cpu_lora_slots_or_remote_replicas_pass():
    assert vllm_problems(compose_run_config(["+recipe=sanity", "trainer.max_staleness=10"])) == []  # 12 == 10 + 2
    remote = ["+recipe=sanity", "trainer.max_staleness=11", "role=trainer", "inference.urls=[http://10.0.0.1:8000]"]
    assert vllm_problems(compose_run_config(remote)) == []  # someone else started those servers


def write_model(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **config}))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("config", "longest"),
    [
        ({"max_position_embeddings": 32768}, 32768),
        ({"max_position_embeddings": 4096, "n_positions": 2048}, 2048),  # the smallest key, as vLLM reads it
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 16384),
        ({"max_position_embeddings": 4096, "model_max_length": 8192}, 8192),
        ({"hidden_size": 64}, None),
    ],
)
def test_derived_max_length(config, longest):
    assert derived_max_length(config) == longest


def test_max_model_len_beyond_the_models_config_is_refused(tmp_path, monkeypatch):
    model = write_model(tmp_path, max_position_embeddings=256, num_attention_heads=6)
    cfg = smoke(f"model.name_or_path={model}", "inference.max_model_len=512")
    assert vllm_model_problems(cfg) == [
        f"inference.max_model_len=512 exceeds the model's maximum length 256 ({model}'s config.json), which vLLM "
        "refuses: lower inference.max_model_len"
    ]
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # vLLM's own escape hatch
    assert vllm_model_problems(cfg) == []
    cfg = smoke(f"model.name_or_path={model}", "inference.max_model_len=256", "inference.gpus_per_replica=4")
    assert vllm_model_problems(cfg)[0].startswith("inference.gpus_per_replica=4 (vLLM's tensor-parallel size)")


def test_a_model_this_machine_does_not_have_is_not_checked(tmp_path):
    assert vllm_model_problems(smoke(f"model.name_or_path={tmp_path}/absent", "inference.max_model_len=99999")) == []


def test_the_cli_exits_2_naming_both_keys_before_any_replica_starts(tmp_path):
    """One CLI run for the GPU path's two refusals: too few CPU LoRA slots, and FA3 forced on a machine without CUDA."""
    result = subprocess.run(
        [sys.executable, "-m", "agrpo", "+recipe=sanity", "trainer.max_staleness=11", "trainer.attention=fa3",
         "launcher.dry_run=true", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "inference.extra_args sets --max-cpu-loras 12, below --max-loras 13" in result.stderr
    assert "trainer.attention=fa3 cannot run here: no CUDA GPU" in result.stderr
    assert "Traceback" not in result.stderr
