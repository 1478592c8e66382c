"""Hub datasets and loaders of one's own are checked before any replica starts, on a bounded sample of rows
(agrpo/data/sample.py through agrpo/config/data_checks.py). The Hub is faked here (no network in tests):
`datasets.load_dataset` is replaced by a stand-in that streams rows from a list and records how it was called."""

from __future__ import annotations

import logging

import pytest

from agrpo.config.compose import compose_run_config
from agrpo.config.data_checks import opened_data_problems
from agrpo.data import sample

RECIPE = """
defaults:
  - override /model: tiny
  - override /data: {data}
run_name: my_task
data:
  prompt_template: "{{question}}"
reward:
  funcs:
    - _target_: agrpo.rewards.generic.numeric_match
      column: answer
trainer:
  max_completion_length: 32
inference:
  max_model_len: 256
"""

MY_DATA = """
import threading

from datasets import Dataset

SEEN = {}
RELEASE = threading.Event()


def rows(data_cfg, seed=0):
    SEEN["max_prompts"] = data_cfg.max_prompts
    count = data_cfg.max_prompts or 10_000
    prompts = [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(count)]
    return Dataset.from_dict({"prompt": prompts, "answer": [i + 1 for i in range(count)]})


def no_prompt(data_cfg, seed=0):
    return Dataset.from_dict({"question": ["1 + 1?"]})


def broken(data_cfg, seed=0):
    raise KeyError("questions")


def hangs(data_cfg, seed=0):
    RELEASE.wait(30)
    return rows(data_cfg, seed)
"""


class FakeStream:
    """What `load_dataset(..., streaming=True)` returns, over a list of rows; records how many rows were taken."""

    def __init__(self, rows: list[dict], calls: list):
        self.rows, self.calls = rows, calls

    def take(self, count: int) -> list[dict]:
        self.calls.append(("take", count))
        return self.rows[:count]


@pytest.fixture()
def task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_data_sample.py").write_text(MY_DATA)
    for data in ("hub", "jsonl"):
        (tmp_path / f"my_{data}.yaml").write_text(RECIPE.format(data=data))
    return tmp_path


def fake_hub(monkeypatch, rows=None, error=None) -> list:
    """Replace datasets.load_dataset; returns the list of recorded calls."""
    import datasets

    calls: list = []

    def load_dataset(name, config_name=None, split=None, streaming=False, **kwargs):
        calls.append((name, config_name, split, streaming))
        if error is not None:
            raise error
        return FakeStream(rows, calls)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def check(task, tiny_model_dir, recipe: str, *overrides: str) -> list[str]:
    from agrpo.cli import expand_recipe_paths

    argv = [f"+recipe={recipe}", f"model.name_or_path={tiny_model_dir}", *overrides]
    return opened_data_problems(compose_run_config(expand_recipe_paths(argv), output_dir=str(task / "run")))


HUB_ROWS = [{"question": f"What is {i} + 1?", "answer": i + 1} for i in range(1000)]


def test_a_hub_dataset_is_checked_on_a_streamed_sample(task, tiny_model_dir, monkeypatch):
    calls = fake_hub(monkeypatch, HUB_ROWS)
    assert check(task, tiny_model_dir, "my_hub.yaml", "data.name=me/sums") == []
    assert calls == [("me/sums", None, "train", True), ("take", sample.SAMPLE_ROWS)]  # streamed: 256 rows, not 1000
    found = check(task, tiny_model_dir, "my_hub.yaml", "data.name=me/sums", "reward.funcs.0.column=anwser")
    assert found == [
        "reward.funcs[0] (agrpo.rewards.generic.numeric_match) reads column(s) ['anwser'], but the dataset's columns "
        "are ['answer', 'prompt', 'question']: set the term's `column:`, or rename a column with data.columns (did "
        "you mean answer?)"
    ]


def test_a_hub_row_too_long_for_the_context_is_named_before_the_start(task, tiny_model_dir, monkeypatch):
    rows = HUB_ROWS[:20] + [{"question": "word " * 400, "answer": 1}]
    fake_hub(monkeypatch, rows)
    [found] = check(task, tiny_model_dir, "my_hub.yaml", "data.name=me/sums")
    assert found.startswith("the prompt at row 20 (counting from 0, before shuffling) is ")
    assert "inference.max_model_len=256 - trainer.max_completion_length=32 = 224" in found


def test_a_hub_dataset_that_does_not_exist_is_one_paragraph(task, tiny_model_dir, monkeypatch):
    fake_hub(monkeypatch, error=FileNotFoundError("Dataset 'me/summs' doesn't exist on the Hub"))
    assert check(task, tiny_model_dir, "my_hub.yaml", "data.name=me/summs") == [
        "data.name='me/summs' (config None, split 'train') could not be loaded: FileNotFoundError: Dataset "
        "'me/summs' doesn't exist on the Hub (check the dataset id, data.config_name and data.split)"
    ]


def test_an_unreachable_hub_leaves_the_check_to_the_trainer_with_one_line(task, tiny_model_dir, monkeypatch, caplog):
    fake_hub(monkeypatch, error=ConnectionError("Couldn't reach 'me/sums' on the Hub (LocalEntryNotFoundError)"))
    with caplog.at_level(logging.INFO, logger="agrpo"):
        assert check(task, tiny_model_dir, "my_hub.yaml", "data.name=me/sums") == []
    [line] = [r.getMessage() for r in caplog.records if "not checked" in r.getMessage()]
    assert "data.name='me/sums' cannot be reached from here (ConnectionError)" in line


def test_a_loader_of_ones_own_is_checked_on_a_capped_sample(task, tiny_model_dir):
    import my_data_sample

    loader = "data.loader=my_data_sample.rows"
    assert check(task, tiny_model_dir, "my_jsonl.yaml", loader) == []
    assert my_data_sample.SEEN["max_prompts"] == sample.SAMPLE_ROWS  # not 10,000 rows
    assert check(task, tiny_model_dir, "my_jsonl.yaml", loader, "data.max_prompts=12") == []
    assert my_data_sample.SEEN["max_prompts"] == 12
    found = check(task, tiny_model_dir, "my_jsonl.yaml", loader, "reward.funcs.0.column=anwser")
    assert len(found) == 1 and found[0].startswith("reward.funcs[0] (agrpo.rewards.generic.numeric_match) reads")


def test_a_loader_that_fails_or_returns_no_prompt_is_named(task, tiny_model_dir):
    assert check(task, tiny_model_dir, "my_jsonl.yaml", "data.loader=my_data_sample.broken") == [
        "data.loader='my_data_sample.broken' failed on a sample of the data: KeyError: 'questions' (it is called as "
        "f(data_cfg, seed) and must return a datasets.Dataset with a `prompt` column)"
    ]
    [found] = check(task, tiny_model_dir, "my_jsonl.yaml", "data.loader=my_data_sample.no_prompt", "data.shuffle=false")
    assert "returned columns ['question']; a `prompt` column is required" in found


def test_a_loader_that_hangs_is_not_waited_for(task, tiny_model_dir, monkeypatch, caplog):
    import my_data_sample

    monkeypatch.setattr(sample, "SAMPLE_TIMEOUT_S", 0.5)
    try:
        with caplog.at_level(logging.INFO, logger="agrpo"):
            assert check(task, tiny_model_dir, "my_jsonl.yaml", "data.loader=my_data_sample.hangs") == []
    finally:
        my_data_sample.RELEASE.set()  # let the abandoned thread finish
    assert any("my_data_sample.hangs' gave no rows within 0.5 s" in r.getMessage() for r in caplog.records)


def test_which_data_is_opened_how():
    from omegaconf import OmegaConf

    def source(**data):
        return sample.sample_source(OmegaConf.create({"path": None, "name": None, **data}))

    assert source(loader="agrpo.data.smoke.load_smoke_dataset") == "whole"
    assert source(loader="agrpo.data.hub.load_hub", name="me/sums") == "hub"
    assert source(loader="agrpo.data.math.load_math", name="gsm8k") is None  # agrpo's own mapping: the trainer's
    assert source(loader="my_data.rows") == "loader"
    assert source(loader="agrpo.data.jsonl.load_jsonl", path="/nowhere.jsonl") is None
