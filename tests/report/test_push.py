"""`agrpo push` against a fake Hub (tests/report/fake_model_hub.py: the Hub cannot be reached from here): the repo is
created, the adapter's files and the model card are committed byte for byte, and bad input fails in one paragraph
before any request."""

from __future__ import annotations

import json
import shutil

import pytest
from fake_model_hub import FAKE_TOKEN, NAMESPACE, FakeModelHub, use_fake_model_hub
from omegaconf import OmegaConf

from agrpo.config.compose import compose_run_config
from agrpo.report.push import main

SUMMARY = {
    "problems": 20,
    "k": 4,
    "samples": 80,
    "mean_at_k": 0.3125,
    "pass_at_1": 0.3125,
    "pass_at_k": 0.55,
    "problems_solved": 11,
    "mean_reward": 0.4,
    "term_means": {},
    "truncated_fraction": 0.05,
    "mean_completion_tokens": 12.5,
    "temperature": 0.6,
    "max_tokens": 16,
}


@pytest.fixture()
def run_dir(tmp_path, random_adapter_dir):
    """A finished run as the trainer leaves it: final_adapter (with peft's blank README), config.yaml, metrics.json,
    Hydra's overrides, the curves picture and an `agrpo eval` summary of the adapter."""
    run = tmp_path / "run"
    shutil.copytree(random_adapter_dir, run / "final_adapter")
    assert "More Information Needed" in (run / "final_adapter" / "README.md").read_text()  # peft's template
    cfg = compose_run_config(["+recipe=smoke"], output_dir=str(run))
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run / "metrics.json").write_text(json.dumps({"global_step": 60, "reward_first": 0.21, "reward_last": 0.83}))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- +recipe=smoke\n- lora.r=8\n- hydra.run.dir=/x\n")
    (run / "training_curves.png").write_bytes(b"\x89PNG fake picture")
    (run / "eval" / "2026-01-01").mkdir(parents=True)
    (run / "eval" / "2026-01-01" / "eval_summary.json").write_text(
        json.dumps({**SUMMARY, "adapter": str(run / "final_adapter")})
    )
    return run


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    with FakeModelHub() as fake:
        use_fake_model_hub(monkeypatch, fake)
        yield fake


def test_push_creates_the_repo_and_commits_adapter_and_card(run_dir, hub, capsys):
    assert main([str(run_dir), "--repo-id", "smoke-lora", "--private"]) == 0
    create = hub.calls("/api/repos/create")
    assert [r.body for r in create] == [
        {"name": "smoke-lora", "organization": None, "visibility": "private", "type": "model"}
    ]
    assert all(r.headers["authorization"] == f"Bearer {FAKE_TOKEN}" for r in hub.requests)
    preupload = hub.calls(f"/api/models/{NAMESPACE}/smoke-lora/preupload/main")
    wanted = {"README.md", "adapter_config.json", "adapter_model.safetensors", "training_curves.png"}
    assert {f["path"] for f in preupload[0].body["files"]} == wanted
    commit = hub.calls(f"/api/models/{NAMESPACE}/smoke-lora/commit/main")[0].body
    assert commit[0] == {"key": "header", "value": {"summary": commit[0]["value"]["summary"], "description": ""}}
    assert commit[0]["value"]["summary"].startswith("agrpo push: LoRA adapter of ")
    repo = hub.repos[f"{NAMESPACE}/smoke-lora"]
    assert set(repo.files) == wanted and repo.visibility == "private"
    for name in ("adapter_model.safetensors", "adapter_config.json", "training_curves.png"):
        local = run_dir / ("final_adapter" if name.startswith("adapter") else "") / name
        assert repo.files[name] == local.read_bytes()
    card = repo.files["README.md"].decode()
    assert "More Information Needed" not in card  # peft's template is replaced
    assert card.startswith("---\nlibrary_name: peft\n")
    assert "![Training curves](training_curves.png)" in card
    assert "| this adapter | 20 | 4 | 0.3125 | 0.3125 | 0.5500 | 11 |" in card
    assert "| mean reward, last 5 steps | 0.8300 |" in card
    assert "python -m agrpo +recipe=smoke lora.r=8\n" in card and "hydra.run.dir" not in card
    assert "--enable-lora --max-lora-rank 8 --lora-modules smoke-lora=alice/smoke-lora" in card
    assert 'PeftModel.from_pretrained(base, "alice/smoke-lora")' in card
    assert f"committed to {hub.url}/alice/smoke-lora" in capsys.readouterr().out


def test_pushing_again_to_an_existing_repo_adds_a_commit(run_dir, hub):
    assert main([str(run_dir), "--repo-id", f"{NAMESPACE}/again"]) == 0
    assert main([str(run_dir), "--repo-id", f"{NAMESPACE}/again", "--base-model", "Qwen/Qwen2.5-0.5B"]) == 0
    repo = hub.repos[f"{NAMESPACE}/again"]
    assert len(repo.commits) == 2 and repo.visibility == "public"
    card = repo.files["README.md"].decode()  # the second card: the base model's Hub id given on the command line
    assert "base_model: Qwen/Qwen2.5-0.5B\n" in card and "vllm serve Qwen/Qwen2.5-0.5B --enable-lora" in card


def test_eval_of_the_base_model_is_added_from_the_command_line(run_dir, hub, tmp_path):
    base_eval = tmp_path / "base_eval"
    base_eval.mkdir()
    (base_eval / "eval_summary.json").write_text(json.dumps({**SUMMARY, "mean_at_k": 0.1, "adapter": None}))
    assert main([str(run_dir), "--repo-id", "cmp", "--eval", str(base_eval)]) == 0
    card = hub.repos[f"{NAMESPACE}/cmp"].files["README.md"].decode()
    assert card.index("| base model | 20 | 4 | 0.1000 |") < card.index("| this adapter | 20 | 4 | 0.3125 |")


def test_dry_run_prints_the_card_and_sends_nothing(run_dir, hub, capsys):
    assert main([str(run_dir), "--repo-id", "smoke-lora", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# smoke-lora" in out and "nothing uploaded" in out and "adapter_model.safetensors" in out
    assert hub.requests == []


def test_a_run_without_final_adapter_is_refused_before_any_request(run_dir, hub, capsys):
    shutil.rmtree(run_dir / "final_adapter")
    assert main([str(run_dir), "--repo-id", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "final_adapter holds no peft adapter" in err
    assert hub.requests == []


def test_no_token_is_refused_before_any_request(run_dir, hub, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    assert main([str(run_dir), "--repo-id", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hf auth login" in err and "HF_TOKEN" in err
    assert hub.requests == []


def test_a_refused_token_is_one_paragraph(run_dir, hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert main([str(run_dir), "--repo-id", "x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agrpo push: error: the Hub refused the push to x") and "Traceback" not in err
    assert "hf_wrong" not in err


def test_a_recipe_given_as_a_file_shows_as_typed(run_dir, tmp_path):
    """`+recipe=my_task.yml` reaches Hydra as recipe `my_task`; the CLI records the file as typed, the card shows it."""
    from agrpo.config.recipe_files import record_recipe_files
    from agrpo.report.push import training_command

    (run_dir / ".hydra" / "overrides.yaml").write_text("- +recipe=my_task\n- model=tiny\n- hydra.run.dir=x\n")
    assert training_command(run_dir) == "python -m agrpo +recipe=my_task model=tiny"
    record_recipe_files(run_dir, {"my_task": "my_task.yml"})
    assert training_command(run_dir) == "python -m agrpo +recipe=my_task.yml model=tiny"
