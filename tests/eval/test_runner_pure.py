"""Evaluation pieces that need no server: which problems, adapter naming, the serving config, scoring one problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.eval_checks import adapter_problems, eval_data_problems
from agrpo.config.prepare import prepare
from agrpo.config.resolve import round_lora_rank
from agrpo.eval.runner import adapter_name, eval_data_config, load_problems, score_problem
from agrpo.rewards.registry import build_reward_funcs
from tests.specs import spec_for

GSM8K_TEST = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"


def cfg_for(*overrides: str):
    return spec_for(*overrides, output_dir="/tmp/agrpo-eval-test")


def test_eval_path_wins_and_split_comes_from_eval():
    data = eval_data_config(cfg_for("+recipe=gsm8k", f"eval.path={GSM8K_TEST}"))
    assert (data.path, data.name, data.split) == (str(GSM8K_TEST), None, "test")
    data = eval_data_config(cfg_for("+recipe=gsm8k"))
    assert (data.path, data.name, data.split) == (None, "gsm8k", "test")
    data = eval_data_config(cfg_for("+recipe=sanity", "eval.name=aime_2024"))
    assert (data.path, data.name) == (None, "aime_2024")


def test_a_training_file_is_never_evaluated_by_accident():
    """The validation pass of `agrpo eval` refuses it (agrpo/config/eval_checks.py)."""
    composed = compose_run_config(["+recipe=gsm8k", "data.path=/x/train.jsonl"], output_dir="/tmp/agrpo-eval-test")
    [problem] = eval_data_problems(composed)
    assert problem.startswith("data.path='/x/train.jsonl' is the training file: set eval.path")
    assert eval_data_problems(compose_run_config(["+recipe=gsm8k", "data.path=/x/train.jsonl", "eval.name=x"])) == []


def test_gsm8k_cpu_recipe_evaluates_the_local_test_file():
    cfg = cfg_for("+recipe=gsm8k_cpu", "eval.max_problems=3")
    problems = load_problems(cfg)
    first = json.loads(GSM8K_TEST.read_text().splitlines()[0])
    assert len(problems) == 3
    assert problems[0]["answer"] == first["answer"].rsplit("####", 1)[1].strip()  # file order, no shuffle
    assert problems[0]["prompt"][0]["role"] == "system"  # SmolLM2's own system prompt


def test_adapter_name_follows_the_weights(tmp_path):
    (tmp_path / "adapter_model.safetensors").write_bytes(b"one")
    first = adapter_name(str(tmp_path))
    assert first.startswith("agrpo-eval-") and first == adapter_name(str(tmp_path))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"two")
    assert adapter_name(str(tmp_path)) != first


def test_a_folder_without_an_adapter_is_refused_by_the_validation_pass(tmp_path):
    [problem] = adapter_problems(compose_run_config(["+recipe=smoke", f"eval.adapter={tmp_path}/missing"]))
    assert "adapter_model.safetensors" in problem and problem.startswith("eval.adapter=")


def test_the_served_rank_holds_the_adapter(tmp_path):
    """prepare sizes inference.max_lora_rank for the evaluated adapter, whatever lora.r the recipe trains."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16}))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")

    def evaluated(*overrides):
        composed = compose_run_config(["+recipe=smoke", *overrides], output_dir=str(tmp_path / "out"))
        return prepare(composed, evaluating=True, cuda_available=False)

    cfg = evaluated(f"eval.adapter={adapter}")
    assert cfg.inference.max_lora_rank == 16 and cfg.lora.r < 16
    assert evaluated().inference.max_lora_rank == round_lora_rank(cfg.lora.r)  # no adapter: lora.r's capacity
    own = evaluated(f"eval.adapter={adapter}", "inference.urls=[http://127.0.0.1:9]")
    assert own.inference.max_lora_rank == round_lora_rank(cfg.lora.r)  # servers of one's own: not started here


def test_score_problem_uses_every_term_and_the_length_rule():
    cfg = cfg_for("+recipe=gsm8k_cpu", "trainer.max_completion_length=8")
    rewards = build_reward_funcs(cfg.reward.funcs)
    row = {"prompt": [{"role": "user", "content": "q"}], "problem": "q", "answer": "18"}
    choices = [
        {"index": 0, "text": "So \\boxed{18}", "token_ids": [1, 2, 3], "finish_reason": "stop"},
        {"index": 1, "text": "#### 18", "token_ids": list(range(8)), "finish_reason": "length"},
        {"index": 2, "text": "\\boxed{17}", "token_ids": [1], "finish_reason": "stop"},
    ]
    result = score_problem(0, row, choices, rewards, ["acc", "format"], cfg)
    assert result.term_scores["acc"] == [1.0, 0.0, 0.0]  # the cut completion scores 0 despite the right answer
    assert result.term_scores["format"] == [1.0, 1.0, 1.0]
    assert result.rewards == [pytest.approx(1.2), pytest.approx(0.2), pytest.approx(0.2)]
    assert result.correct == [True, False, False]
    assert result.truncated == [False, True, False]
    assert result.completion_tokens == [3, 8, 1]


def test_cli_help_and_bad_override(capsys):
    from agrpo.eval.cli import main

    assert main(["--help"]) == 0
    assert "agrpo eval +recipe=NAME" in capsys.readouterr().out
    assert main(["+recipe=smoke", "eval.no_such_knob=1"]) == 2
    assert "no_such_knob" in capsys.readouterr().err


def test_cli_takes_a_recipe_file_and_reports_config_errors(tmp_path, capsys):
    from agrpo.eval.cli import main

    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "# @package _global_\ndefaults:\n  - /recipe/gsm8k_cpu\ndata:\n  path: /x/train.jsonl\neval:\n"
        f"  path: null\n  output_dir: {tmp_path / 'out'}\n"
    )
    assert main([f"+recipe={recipe}"]) == 2
    assert "eval.path" in capsys.readouterr().err
