"""data=jsonl and data=hub: prompts from text, chat messages or a template; every other column kept for the rewards."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from agrpo.config.compose import compose_run_config
from agrpo.data import load_train_dataset
from agrpo.data.jsonl import chat_messages, render_prompt, to_task_rows
from agrpo.errors import ConfigError

ROWS = [
    {"prompt": "What is 2+2?", "answer": "4", "difficulty": 1, "tags": ["add"]},
    {
        "prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 3*3?"}],
        "answer": "9",
        "difficulty": 2,
        "tags": ["mul"],
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_text_and_chat_prompts_become_messages_and_other_columns_stay():
    text = render_prompt(ROWS[0], system_prompt="You are exact.", instruction="Answer with a number.")
    assert text == [
        {"role": "system", "content": "You are exact."},
        {"role": "user", "content": "What is 2+2? Answer with a number."},
    ]
    chat = render_prompt(ROWS[1], system_prompt="You are exact.")  # the row's own system turn is kept
    assert chat == ROWS[1]["prompt"]
    dataset = to_task_rows(datasets.Dataset.from_list([ROWS[0]]), system_prompt=None)
    assert sorted(dataset.column_names) == ["answer", "difficulty", "prompt", "tags"]
    assert dataset[0] == {
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "answer": "4",
        "difficulty": 1,
        "tags": ["add"],
    }


def test_template_builds_the_prompt_from_columns_and_renames_apply_first():
    raw = datasets.Dataset.from_list([{"q": "Capital of France?", "a": "Paris", "lang": "en"}])
    rows = to_task_rows(raw, columns={"a": "answer"}, prompt_template="[{lang}] {q}")
    assert rows[0]["prompt"] == [{"role": "user", "content": "[en] Capital of France?"}]
    assert rows[0]["answer"] == "Paris" and rows[0]["q"] == "Capital of France?"
    renamed = to_task_rows(raw, columns={"q": "prompt"})
    assert renamed[0]["prompt"][0]["content"] == "Capital of France?" and "q" not in renamed.column_names


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        ([{"question": "x"}], {}, r"\+data.columns.your_column=prompt"),
        ([{"q": "x"}], {"prompt_template": "{question}"}, "not a column"),
        ([{"prompt": "x"}], {"columns": {"nope": "answer"}}, "renames"),
        ([{"prompt": "x", "completions": "y"}], {}, "clash"),
        ([{"prompt": [{"role": "robot", "content": "x"}]}], {}, "roles"),
        ([{"prompt": 5}], {}, "text or a list of chat messages"),
    ],
)
def test_bad_rows_name_the_fix(rows, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        to_task_rows(datasets.Dataset.from_list(rows), **kwargs)


def test_chat_messages_keeps_roles_and_content():
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
    with pytest.raises(ConfigError):
        chat_messages([])


def test_data_jsonl_from_the_config(tmp_path):
    path = write_jsonl(tmp_path / "task.jsonl", ROWS)
    cfg = compose_run_config(
        ["+recipe=smoke", "data=jsonl", f"data.path={path}", "data.shuffle=false", "data.system_prompt=Sys."]
    )
    dataset = load_train_dataset(cfg.data, seed=0)
    assert len(dataset) == 2
    assert dataset[0]["prompt"][0] == {"role": "system", "content": "Sys."}
    assert dataset[1]["prompt"][0] == {"role": "system", "content": "Be terse."}
    assert dataset["answer"] == ["4", "9"] and dataset["difficulty"] == [1, 2] and dataset["tags"] == [["add"], ["mul"]]


def test_data_jsonl_without_a_path_or_with_a_missing_file():
    cfg = compose_run_config(["+recipe=smoke", "data=jsonl"])
    with pytest.raises(ConfigError, match="data.path=FILE"):
        load_train_dataset(cfg.data, seed=0)
    cfg = compose_run_config(["+recipe=smoke", "data=jsonl", "data.path=/nonexistent/task.jsonl"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_train_dataset(cfg.data, seed=0)


def test_data_hub_maps_a_dataset_by_name(tmp_path):
    """The Hub cannot be reached here, so the name is a local folder of data files, which load_dataset takes the
    same way; what is tested is the mapping after load_dataset, which is the same code for a Hub dataset."""
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(5)])
    write_jsonl(folder / "test.jsonl", [{"question": "t", "answer": "0"}])
    cfg = compose_run_config(
        [
            "+recipe=smoke",
            "data=hub",
            f"data.name={folder}",
            "data.shuffle=false",
            "data.prompt_template='Solve: {question}'",
        ]
    )
    dataset = load_train_dataset(cfg.data, seed=0)
    assert len(dataset) == 5
    assert dataset[3]["prompt"] == [{"role": "user", "content": "Solve: q3"}] and dataset[3]["answer"] == "3"
    cfg.data.split = "test"
    assert len(load_train_dataset(cfg.data, seed=0)) == 1
    with pytest.raises(ConfigError, match="data.name=OWNER/DATASET"):
        load_train_dataset(compose_run_config(["+recipe=smoke", "data=hub"]).data, seed=0)


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "your_task.md"


def test_the_guides_data_and_recipe_compose_load_and_score(tmp_path, monkeypatch):
    """docs/your_task.md as written: its data script and its recipe block (the walk itself ran by hand and in
    tests/e2e/test_own_task.py)."""
    from agrpo.rewards.registry import build_reward_funcs

    guide = GUIDE.read_text()
    script = guide.split("python - <<'EOF'\n", 1)[1].split("\nEOF", 1)[0]
    recipe = guide.split("`my_task.yaml`, next to the data:\n\n```yaml\n", 1)[1].split("\n```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "guide-data", "exec"), {})  # the guide's own snippet
    (tmp_path / "my_task.yaml").write_text(recipe + "\n")
    from agrpo.cli import expand_recipe_paths

    cfg = compose_run_config(
        expand_recipe_paths(["+recipe=my_task.yaml", "model=tiny", "data.shuffle=false"]),
        output_dir=str(tmp_path / "out"),
    )
    dataset = load_train_dataset(cfg.data, seed=0)
    first = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert len(dataset) == 256 and dataset[0]["answer"] == first["answer"]
    assert dataset[0]["prompt"] == [{"role": "user", "content": f"{first['question']} Reply with the number only."}]
    rewards = build_reward_funcs(cfg.reward.funcs)
    scores = [
        r(completions=[f" {first['answer']}", "It is 3"], completion_ids=[[1], [1]], answer=[first["answer"]] * 2)
        for r in rewards
    ]
    assert scores == [[1.0, 0.0], [0.2, 0.0]]


def test_config_problems_before_anything_starts(tmp_path):
    from agrpo.data.jsonl import config_problems

    def problems(*overrides):
        return config_problems(compose_run_config(["+recipe=smoke", *overrides]).data)

    assert problems("data=jsonl") == [
        "data=jsonl needs data.path=FILE (a JSONL file with a `prompt` and the columns your rewards read)"
    ]
    assert "does not exist" in problems("data=jsonl", f"data.path={tmp_path}/nope.jsonl")[0]
    assert problems("data=jsonl", f"data.path={write_jsonl(tmp_path / 't.jsonl', ROWS)}") == []
    assert "data.name=OWNER/DATASET" in problems("data=hub")[0]
    assert problems("data=hub", "data.name=owner/set") == [] and problems() == []
