"""`agrpo eval` on a data=jsonl task: the test file's extra columns reach the reward terms, and no `answer` column
is required (the terms name the column they read)."""

from __future__ import annotations

import json

from agrpo.eval.runner import load_problems, problem_of, score_problem
from agrpo.rewards.registry import build_reward_funcs
from tests.specs import spec_for


def test_jsonl_test_file_columns_reach_the_rewards(tmp_path):
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"question": f"Capital {i}?", "city": f"C{i}"}) + "\n" for i in range(3)))
    cfg = spec_for(
        "+recipe=smoke",
        "data=jsonl",
        f"data.path={tmp_path}/train.jsonl",
        "reward=exact_match",
        "reward.funcs.0.column=city",
        "+data.columns.question=prompt",
        f"eval.path={test_file}",
        "eval.max_problems=2",
        output_dir=str(tmp_path / "out"),
    )
    problems = load_problems(cfg)
    assert len(problems) == 2 and problems[1]["city"] == "C1"
    assert problem_of(problems[1]) == "Capital 1?"
    rewards = build_reward_funcs(cfg.reward.funcs)
    choices = [
        {"index": 0, "text": "The answer is C1.", "token_ids": [1]},
        {"index": 1, "text": "The answer is C0.", "token_ids": [1]},
    ]
    result = score_problem(1, problems[1], choices, rewards, ["exact_match"], cfg)
    assert result.term_scores["exact_match"] == [1.0, 0.0] and result.correct == [True, False]
    assert result.problem == "Capital 1?" and result.answer == ""


def test_a_term_reading_a_missing_column_fails_before_any_server_starts(tmp_path):
    import pytest

    from agrpo.errors import ConfigError
    from agrpo.eval.runner import run_eval

    test_file = tmp_path / "test.jsonl"
    test_file.write_text(json.dumps({"prompt": "Capital of France?", "city": "Paris"}) + "\n")
    cfg = spec_for(
        "+recipe=smoke",
        "data=jsonl",
        f"data.path={test_file}",
        "reward=exact_match",
        f"eval.path={test_file}",
        "inference.urls=[http://127.0.0.1:9]",
        output_dir=str(tmp_path / "out"),
    )
    with pytest.raises(ConfigError, match=r"reads column\(s\) \['answer'\].*\['city', 'prompt'\]"):
        run_eval(cfg, tmp_path / "out")
