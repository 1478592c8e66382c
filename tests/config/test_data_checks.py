"""The data opened before anything starts (agrpo/config/data_checks.py): the mistakes that used to surface only once
vLLM was up (issue 23: a misspelt column, template field or reward option, about 45 s in, exit 1) are found by the
validation pass, dry run included, with exit 2 naming the key."""

from __future__ import annotations

import json

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.data_checks import opened_data_problems, reward_problems, sample_indices
from agrpo.config.validate import validate
from tests.processes import agrpo

RECIPE = """
defaults:
  - override /model: tiny
  - override /data: jsonl
run_name: my_task
data:
  path: train.jsonl
  prompt_template: "{question}"
reward:
  funcs:
    - _target_: agrpo.rewards.generic.numeric_match
      column: answer
    - _target_: my_rewards.py:politeness
      weight: 0.2
trainer:
  max_completion_length: 32
inference:
  max_model_len: 256
"""

MY_REWARDS = """
from agrpo.rewards import completion_text


def politeness(completions, answer, style="plain", **columns):
    return [float(completion_text(c).startswith("Sure")) for c in completions]
"""


@pytest.fixture()
def task(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    rows = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    (tmp_path / "my_task.yaml").write_text(RECIPE)
    return tmp_path


def problems(task, tiny_model_dir, *overrides: str) -> list[str]:
    from agrpo.cli import expand_recipe_paths

    argv = ["+recipe=my_task.yaml", f"model.name_or_path={tiny_model_dir}", *overrides]
    return opened_data_problems(compose_run_config(expand_recipe_paths(argv), output_dir=str(task / "run")))


def test_the_task_as_written_passes(task, tiny_model_dir):
    assert problems(task, tiny_model_dir) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "reward.funcs.0.column=anwser",
            "reward.funcs[0] (agrpo.rewards.generic.numeric_match) reads column(s) ['anwser'], but the dataset's "
            "columns are ['answer', 'prompt', 'question']: set the term's `column:`, or rename a column with "
            "data.columns (did you mean answer?)",
        ),
        (
            "data.prompt_template='{questoin}'",
            "data.prompt_template='{questoin}' names 'questoin', which is not a column; the columns are "
            "['answer', 'question']",
        ),
        (
            "+reward.funcs.0.colum=answer",
            "reward.funcs[0] (agrpo.rewards.generic.numeric_match) takes no option 'colum' (did you mean "
            "reward.funcs[0].column?); its options are ['abs_tol', 'column', 'extract', 'rel_tol']",
        ),
        (
            "+data.columns.answer=gold",
            "reward.funcs[0] (agrpo.rewards.generic.numeric_match) reads column(s) ['answer'], but the dataset's "
            "columns are ['gold', 'prompt', 'question']: set the term's `column:`, or rename a column with "
            "data.columns",
        ),
    ],
    ids=["column", "template", "option", "renamed"],
)
def test_each_mistake_names_its_key(task, tiny_model_dir, override, expected):
    found = problems(task, tiny_model_dir, override)
    assert expected in found[0]


def test_a_reward_of_ones_own_names_the_column_it_needs(task, tiny_model_dir):
    found = problems(task, tiny_model_dir, "+data.columns.answer=solution")
    assert any("reward.funcs[1] (my_rewards.py:politeness) reads column(s) ['answer']" in p for p in found)
    found = problems(task, tiny_model_dir, "+reward.funcs.1.styl=short")
    assert found == [
        "reward.funcs[1] (my_rewards.py:politeness) takes no option 'styl' (did you mean reward.funcs[1].style?); "
        "its options are ['answer', 'style']"
    ]


@pytest.mark.parametrize("shuffle", ["true", "false"])
def test_a_prompt_too_long_for_the_model_names_its_line_in_the_file_and_both_keys(task, tiny_model_dir, shuffle):
    """The file's line, shuffled or not, blank lines between rows (before: "row 11" for what was on line 21)."""
    rows = [{"question": "short?", "answer": 1}] * 10 + [{"question": "long " * 300, "answer": 2}]
    (task / "train.jsonl").write_text("".join(json.dumps(row) + "\n\n" for row in rows))
    found = problems(task, tiny_model_dir, f"data.shuffle={shuffle}")
    assert len(found) == 1 and found[0].startswith("the prompt at line 21 of train.jsonl is ")
    assert "inference.max_model_len=256 - trainer.max_completion_length=32 = 224" in found[0]


def test_a_row_of_data_that_is_not_a_jsonl_file_is_named_by_its_place_before_shuffling(task, tiny_model_dir):
    from datasets import Dataset

    rows = [{"question": "short?", "answer": 1}] * 10 + [{"question": "long " * 300, "answer": 2}]
    Dataset.from_list(rows).to_parquet(str(task / "train.parquet"))
    found = problems(task, tiny_model_dir, "data.path=train.parquet")
    assert len(found) == 1 and found[0].startswith("the prompt at row 10 (counting from 0, before shuffling) is ")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"question": "a?", "answer": 1}\n\n{"question": "b?", "ans\n', "line 3 of train.jsonl is not valid JSON ("),
        ("", "train.jsonl is empty: a JSONL file holds one JSON object per line"),
        ('{"question": "a?", "answer": 1}\n# a comment\n', "line 2 of train.jsonl is not valid JSON"),
    ],
    ids=["truncated", "empty", "comment"],
)
def test_a_broken_or_empty_file_is_named_with_its_line(task, tiny_model_dir, text, expected):
    (task / "train.jsonl").write_text(text)
    found = problems(task, tiny_model_dir)
    assert len(found) == 1 and found[0].startswith(f"data.path='train.jsonl': {expected}"), found
    assert "StopIteration" not in found[0] and "position" not in found[0]


def test_a_chat_template_trl_does_not_know_is_refused_before_it_stops_the_rollout_worker(task, tiny_model_dir):
    plain = task / "plain.jinja"
    plain.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    found = problems(task, tiny_model_dir, f"model.chat_template={plain}")
    assert found and "TRL's rollout worker does not recognise the chat template" in found[0]
    assert "set model.chat_template" in found[0]


def test_a_row_the_chat_template_cannot_render_is_named(task, tiny_model_dir):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": 1}] * 3
    rows.append({"prompt": [{"role": "assistant", "content": "me first"}], "answer": 2})
    (task / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    strict = task / "strict.jinja"
    strict.write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('a conversation starts with a user turn') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    found = problems(
        task, tiny_model_dir, "data.prompt_template=null", "data.shuffle=false", f"model.chat_template={strict}"
    )
    assert len(found) == 2 and "does not recognise the chat template" in found[0]
    assert found[1].startswith("line 4 of train.jsonl [prompt 'me first'] does not render through the chat template of")
    assert "a conversation starts with a user turn" in found[1]


def test_reward_columns_of_wrappers_and_generic_defaults():
    funcs = [
        {"_target_": "agrpo.rewards.generic.exact_match", "weight": 1.0},
        {"_target_": "agrpo.rewards.generic.regex_match", "column": "rx"},
        {
            "_target_": "agrpo.rewards.math.zero_if_truncated",
            "reward": "agrpo.rewards.generic.numeric_match",
            "max_completion_length": 64,
            "column": "gold",
        },
        {"_target_": "agrpo.rewards.generic.regex_match", "regex": "x"},
        {"_target_": "agrpo.rewards.smoke.lowercase_fraction"},
    ]
    found = reward_problems(funcs, ["prompt", "rx"])
    assert len(found) == 2
    assert found[0].startswith("reward.funcs[0] (agrpo.rewards.generic.exact_match) reads column(s) ['answer']")
    assert found[1].startswith("reward.funcs[2] (agrpo.rewards.math.zero_if_truncated) reads column(s) ['gold']")
    assert reward_problems(funcs, ["prompt", "rx", "answer", "gold"]) == []


def test_the_sample_holds_the_first_and_the_longest_rows():
    prompts = ["x"] * 30 + ["y" * 100] + ["x"] * 30
    assert sample_indices(prompts)[:8] == list(range(8)) and 30 in sample_indices(prompts)


def test_shipped_recipes_still_pass_with_their_data_opened(monkeypatch):
    from tests.conftest import SHARED_DATA

    monkeypatch.setenv("AGRPO_DATA_DIR", str(SHARED_DATA))
    for recipe in ("smoke", "gsm8k_cpu"):
        validate(compose_run_config([f"+recipe={recipe}"], output_dir="/tmp/agrpo-validate"))


def test_the_dry_run_stops_on_a_data_mistake_with_exit_2(task, tiny_model_dir):
    result = agrpo(
        "+recipe=my_task.yaml", "reward.funcs.0.column=anwser", "launcher.dry_run=true", cwd=task, timeout=300
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("agrpo: error: invalid config (1 problem): reward.funcs[0]")
    assert "[replica]" not in result.stdout


def test_a_model_folder_transformers_refuses_is_one_paragraph_before_anything_starts(tmp_path):
    """A config.json field of the wrong type made transformers raise its own validation error (a traceback) from the
    data checks; it is now agrpo's ConfigError naming the folder and the field."""
    from omegaconf import OmegaConf

    from agrpo.config.data_checks import local_tokenizer
    from agrpo.errors import ConfigError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": "x"}))
    model = OmegaConf.create({"name_or_path": str(tmp_path), "builder": None, "trust_remote_code": False})
    with pytest.raises(ConfigError) as error:
        local_tokenizer(model)
    message = str(error.value)
    assert message.startswith(f"model.name_or_path='{tmp_path}': transformers cannot read this model")
    assert "hidden_size" in message and "\n" not in message
