"""The GPU memory check does not depend on a warm Hub cache (issue 45): the model's config.json is read from its
folder or the cache, else fetched where the Hub answers, else the check says why it ran without the model's
estimates. The Hub cannot be reached from here: `hf_hub_download` is replaced where a fetch is the point."""

from __future__ import annotations

import json
import logging

import huggingface_hub
import pytest

from agrpo.config import gpu_precision
from agrpo.config.compose import compose_run_config
from agrpo.config.gpu_precision import GpuFacts
from agrpo.config.machine_checks import gpu_problems
from agrpo.config.model_config_fetch import model_config_for_check
from tests.config.test_gpu_plan_topologies import QWEN2_5_0_5B

H100 = GpuFacts(cuda=True, name="NVIDIA H100 80GB HBM3", capability=(9, 0), memory_bytes=81559 * 1024**2, count=1)


def test_a_model_folder_is_read_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    assert model_config_for_check(str(tmp_path)) == (QWEN2_5_0_5B, "")


def test_offline_and_not_cached_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config, why = model_config_for_check("someone/not-cached-model")
    assert (
        config is None and why == "someone/not-cached-model's config.json is not in the Hub cache and HF_HUB_OFFLINE=1"
    )


def test_a_model_agrpo_builds_at_start_up_has_none_yet(tmp_path):
    config, why = model_config_for_check(str(tmp_path / "models" / "tiny-qwen2"))
    assert config is None and "has no config.json yet" in why


def test_where_the_hub_answers_the_config_is_fetched_the_first_time(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fetched = tmp_path / "config.json"
    fetched.write_text(json.dumps({"text_config": QWEN2_5_0_5B}))
    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **kw: asked.append(repo) or str(fetched))
    assert model_config_for_check("Qwen/Qwen2.5-0.5B-Instruct") == (QWEN2_5_0_5B, "")
    assert asked == ["Qwen/Qwen2.5-0.5B-Instruct"]


def test_a_failed_fetch_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    config, why = model_config_for_check("Qwen/Qwen2.5-0.5B-Instruct")
    assert config is None and "could not be fetched (OSError: Network is unreachable)" in why


@pytest.fixture()
def one_h100(monkeypatch):
    monkeypatch.setattr(gpu_precision, "local_facts", lambda: H100)


def test_the_validation_pass_refuses_the_issues_plan_on_a_simulated_h100(one_h100, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_5_0_5B))
    cfg = compose_run_config(
        ["+recipe=gsm8k", f"model.name_or_path={tmp_path}", "inference.replicas=2", "inference.gpus=[0,0]",
         "trainer.gpus=[0]"],
        output_dir="/r",
    )  # fmt: skip
    [problem] = gpu_problems(cfg)
    assert problem.startswith("the GPU plan does not fit: GPU 0 (NVIDIA H100 80GB HBM3, 79.6 GiB) would hold 2")
    assert "`trainer.gradient_checkpointing=true`" in problem


def test_without_the_models_config_the_check_says_so_and_still_checks_the_placement(one_h100, monkeypatch, caplog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_run_config(
        ["+recipe=gsm8k", "model.name_or_path=someone/not-cached", "inference.replicas=3", "inference.gpus=[0,0,0]"],
        output_dir="/r",
    )
    with caplog.at_level(logging.WARNING, logger="agrpo"):
        [problem] = gpu_problems(cfg)
    assert "GPU memory check without the model's estimates: someone/not-cached's config.json" in caplog.text
    assert "3 replica(s) at 0.35 + 0.35 + 0.35" in problem
