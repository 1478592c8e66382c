"""The adapter snapshot written off the trainer's thread holds exactly what peft's own save writes."""

import json
import os
import threading

import torch
from accelerate import Accelerator
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from agrpo.trainer.sync.snapshot import snapshot_adapter


def test_the_snapshot_is_peft_s_save_and_later_training_does_not_leak_into_it(
    tiny_model_dir, random_adapter_dir, tmp_path
):
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), random_adapter_dir)
    snapshot = snapshot_adapter(model, Accelerator(cpu=True), "default")
    model.save_pretrained(tmp_path / "peft")  # the reference: peft's own save, before the weights move
    with torch.no_grad():  # the next optimizer step changes the live tensors in place
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(1.0)
    dest = tmp_path / ".vllm_lora" / "trl-policy-v3"
    dest.parent.mkdir()
    writer = threading.Thread(target=snapshot.write, args=(str(dest),))  # as the sync thread does
    writer.start()
    writer.join()
    assert sorted(os.listdir(dest)) == ["adapter_config.json", "adapter_model.safetensors"]
    assert os.listdir(dest.parent) == ["trl-policy-v3"]  # the staging folder was renamed, nothing left behind
    ours = load_file(dest / "adapter_model.safetensors")
    peft = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert ours.keys() == peft.keys() and ours
    assert all(torch.equal(ours[key], peft[key]) for key in ours)
    assert any(t.abs().max() > 0 for k, t in ours.items() if "lora_B" in k)
    config = json.loads((dest / "adapter_config.json").read_text())
    reference = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    for written in (config, reference):  # a set in peft's config: written in whatever order the set iterates
        written["target_modules"] = sorted(written["target_modules"])
    assert config == reference
    assert config["inference_mode"] is True
