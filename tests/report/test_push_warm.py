"""`agrpo push` of a warm-started agent run (agrpo/agents/sharing.py): the adapter was trained on the warm start's
model folder, so the repo carries that folder under warm_base/ and the card names the recipe's base, the serve
command with the tool-call flags, and a request with the tools as training showed them. Pushed to the fake Hub
(tests/report/fake_model_hub.py: the Hub cannot be reached from here), pulled into a clean folder as a download
would lay it out, and loaded there with peft: the pulled model computes what the trained one did. Serving it with
vLLM is the agent e2e's part (tests/e2e/test_agent.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_model_hub import NAMESPACE, FakeModelHub, use_fake_model_hub
from omegaconf import OmegaConf

from agrpo.report.push import main
from tests.agents.test_warmstart import planned, task  # noqa: F401 (task: the own-tool task, a fixture)


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    with FakeModelHub() as fake:
        use_fake_model_hub(monkeypatch, fake)
        yield fake


def pull(hub: FakeModelHub, repo_id: str, folder):
    """The repo's files as `hf download REPO --local-dir folder` lays them out (the fake keeps their bytes)."""
    for name, data in hub.repos[repo_id].files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def adapter_on(model_dir, out):
    """A LoRA of `model_dir` with random B matrices (it visibly changes the model), saved as the trainer saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)  # the chat template, as the trainer saves it
    return out


def logits(model, tokenizer):
    import torch

    ids = tokenizer("How many zorbs is 3 quib?", return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture()
def warm_run(task, tiny_model_dir):  # noqa: F811
    from agrpo.agents.warmstart import build_warm_model

    cfg = planned(task, tiny_model_dir)
    warm = build_warm_model(str(cfg.model.name_or_path), cfg.model.builder_input)
    run = task / "run"
    adapter_on(warm, run / "final_adapter")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return run, warm


def test_a_warm_started_adapter_travels_with_its_base_and_loads_from_the_hub_alone(warm_run, hub, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, warm = warm_run
    assert main([str(run), "--repo-id", "units-agent"]) == 0
    repo_id = f"{NAMESPACE}/units-agent"
    files = hub.repos[repo_id].files
    assert {"warm_base/model.safetensors", "warm_base/config.json", "warm_base/agrpo_tools.json"} <= set(files)
    assert files["warm_base/model.safetensors"] == (Path(warm) / "model.safetensors").read_bytes()
    shutil.rmtree(warm)  # a clean environment: nothing of the run's machine is left to load from
    pulled = pull(hub, repo_id, tmp_path / "pulled")
    tokenizer = AutoTokenizer.from_pretrained(pulled)
    base = AutoModelForCausalLM.from_pretrained(pulled / "warm_base")
    bare = logits(base, tokenizer)
    model = PeftModel.from_pretrained(base, pulled)
    trained = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(pulled / "warm_base"), run / "final_adapter"
    )
    assert (logits(model, tokenizer) - logits(trained, tokenizer)).abs().max() == 0  # what training left, loaded
    assert (logits(model, tokenizer) - bare).abs().max() > 0.1  # and the adapter does change the model


def test_the_card_names_the_recipe_base_and_serves_the_tools_as_trained(warm_run, hub, tiny_model_dir):
    run, warm = warm_run
    assert main([str(run), "--repo-id", "units-agent"]) == 0
    card = hub.repos[f"{NAMESPACE}/units-agent"].files["README.md"].decode()
    assert f"`{tiny_model_dir}` (built by `agrpo.models.tiny.build_tiny_model`), warm-started by agrpo" in card
    assert "hf download alice/units-agent --local-dir ./units-agent\n" in card
    serve = card.split("vllm serve ", 1)[1].split("\ncurl", 1)[0]
    assert serve.split(" \\\n  ") == [
        "./units-agent/warm_base --enable-lora --max-lora-rank 8 --lora-modules units-agent=./units-agent",
        "--max-model-len 2048",  # the model's own context: a chat request's prompt with the tool list fits
        "--chat-template ./units-agent/chat_template.jinja",
        "--enable-auto-tool-choice --tool-call-parser hermes",  # Qwen's <tool_call> format
    ]
    request = json.loads(card.split("-d '", 1)[1].split("'\n", 1)[0])
    saved = json.loads((Path(warm) / "agrpo_tools.json").read_text())
    assert request["tools"] == saved and [t["function"]["name"] for t in saved] == ["convert"]
    assert "return" not in saved[0]["function"]  # vLLM's chat API has no such key: training rendered none either
    assert request["messages"] == [{"role": "user", "content": "How many zorbs is 2 florp?"}]  # a row of the run
    assert 'AutoModelForCausalLM.from_pretrained("alice/units-agent", subfolder="warm_base")' in card


def test_a_run_whose_warm_base_is_gone_is_refused_in_one_paragraph(warm_run, hub, capsys):
    run, warm = warm_run
    shutil.rmtree(warm)
    assert main([str(run), "--repo-id", "units-agent", "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "trained on the warm start's model" in error and "which is gone" in error and not hub.requests
