"""FSDP2 and tied embeddings: the untie helper, TRL's model-load hook it rides on, and real FSDP2 on CPU (gloo)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import torch

from agrpo.trainer.seam.fsdp_compat import running_under_fsdp, untie_embeddings
from agrpo.trainer.seam.module_patches import fix_loaded_model
from tests.launchers.tiny_qwen2 import tiny_qwen2

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_untie_gives_the_head_its_own_copy_and_changes_no_output():
    model = tiny_qwen2(tied=True)
    ids = torch.tensor([[5, 6, 7]])
    before = model(ids).logits
    assert untie_embeddings(model) is True
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert not model.config.tie_word_embeddings
    model.tie_weights()  # transformers must not re-tie them
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model(ids).logits, before)


def test_untie_leaves_an_untied_model_alone():
    model = tiny_qwen2(tied=False)
    head = model.lm_head.weight
    assert untie_embeddings(model) is False and model.lm_head.weight is head


def test_fsdp_is_detected_from_accelerates_env(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not running_under_fsdp()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert running_under_fsdp()


def test_trl_still_loads_its_model_through_the_hooked_function():
    """If TRL stops calling create_model_from_path in AsyncGRPOTrainer.__init__, the untie hook does nothing."""
    import inspect

    module = importlib.import_module("trl.experimental.async_grpo.async_grpo_trainer")
    assert "create_model_from_path(" in inspect.getsource(module.AsyncGRPOTrainer.__init__)
    original = module.create_model_from_path
    seen = []
    with fix_loaded_model(seen.append):
        assert module.create_model_from_path is not original
    assert module.create_model_from_path is original


def test_fsdp2_on_cpu_refuses_a_tied_head_and_trains_after_untie(tmp_path, held_port):
    """Real torch FSDP2 (fully_shard over gloo, 2 ranks on CPU): the refusal that untie_embeddings avoids."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    port = held_port  # the rendezvous port, held while torch.distributed binds it
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port),
            str(Path(__file__).parent / "fsdp_untie_worker.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, "\n".join(line for line in result.stderr.splitlines() if "arn" not in line)[:4000]
    lines = result.stdout.splitlines()
    assert sum("tied: refused" in line and "shared" in line for line in lines) == 2
    losses = {line for line in lines if line.startswith("untied: loss")}
    assert len(losses) == 1  # both ranks computed the same loss on the sharded model
