"""Math dataset loaders: the local copies in ../shared/data, every local file format, column mapping, prompt shape."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download; set before datasets is first imported
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest

from agrpo.data.math import is_local, load_math, load_math_dataset, to_math_rows
from agrpo.data.prompts import DEFAULT_INSTRUCTION, build_prompt, problem_text
from agrpo.rewards.math import gsm8k_accuracy, math_accuracy

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _local(relative: str) -> Path:
    path = DATA / relative
    if not path.exists():
        pytest.fail(f"local dataset copy {path} is absent (see the project's data notes); nothing is downloaded")
    return path


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("split", "rows"), [("train", 7473), ("test", 1319)])
def test_gsm8k_local_copy(split: str, rows: int) -> None:
    path = _local(f"gsm8k/{split}.jsonl")
    dataset = load_math_dataset(path)
    assert len(dataset) == rows
    assert sorted(dataset.column_names) == ["answer", "problem", "prompt"]
    raw = _raw(path)
    assert dataset[0]["problem"] == raw[0]["question"]
    assert dataset[0]["prompt"] == [{"role": "user", "content": f"{raw[0]['question']} {DEFAULT_INSTRUCTION}"}]
    assert all("####" not in answer for answer in dataset["answer"])
    assert gsm8k_accuracy([f"#### {a}" for a in dataset["answer"]], answer=[r["answer"] for r in raw]) == [1.0] * rows


@pytest.mark.parametrize(
    ("relative", "rows"), [("sanity/train.jsonl", 1460), ("sanity/aime_2024.jsonl", 30), ("sanity/aime_2025.jsonl", 30)]
)
def test_math_local_copies_keep_their_gold_answers(relative: str, rows: int) -> None:
    path = _local(relative)
    dataset = load_math_dataset(path, system_prompt="You are a careful mathematician.")
    raw = _raw(path)
    assert len(dataset) == rows
    assert dataset["answer"] == [str(r["answer"]).strip() for r in raw]
    assert dataset[0]["prompt"][0] == {"role": "system", "content": "You are a careful mathematician."}
    assert dataset[0]["prompt"][1]["content"].endswith(r"within \boxed{}.")
    if rows == 30:  # AIME golds like "025" stay strings, and still score a model's "25"
        assert (
            math_accuracy([r"\boxed{" + str(int(a)) + "}" for a in dataset["answer"]], answer=dataset["answer"])
            == [1.0] * rows
        )


@pytest.fixture
def small() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"q": ["What is 2+2?", "What is 3*3?"], "final": [4, 9], "other": [1, 2]})


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".arrow", ".csv", "saved"])
def test_every_local_format_with_a_column_mapping(tmp_path: Path, small: datasets.Dataset, suffix: str) -> None:
    path = tmp_path / f"data{suffix}" if suffix != "saved" else tmp_path / "saved"
    if suffix == ".jsonl":
        small.to_json(path)
    elif suffix == ".parquet":
        small.to_parquet(path)
    elif suffix == ".csv":
        small.to_csv(path, index=False)
    elif suffix == ".arrow":
        small.save_to_disk(tmp_path / "tmp")
        path = next((tmp_path / "tmp").glob("*.arrow"))
    else:
        datasets.DatasetDict({"test": small}).save_to_disk(path)
    dataset = load_math_dataset(path, "test", columns={"q": "problem", "final": "answer"}, instruction=None)
    assert dataset["prompt"] == [[{"role": "user", "content": q}] for q in ("What is 2+2?", "What is 3*3?")]
    assert dataset["answer"] == ["4", "9"]


def test_hub_shaped_rows_give_back_the_bare_problem() -> None:
    """Sanity's Hub copy ships chat prompts ending in the instruction and the gold in verl's reward_model struct."""
    hub_like = datasets.Dataset.from_list(
        [
            {
                "data_source": "math",
                "prompt": [{"role": "user", "content": f"Compute $1+1$. {DEFAULT_INSTRUCTION}"}],
                "reward_model": {"ground_truth": r"\frac{1}{2}", "style": "rule"},
            }
        ]
    )
    row = to_math_rows(hub_like, system_prompt="Think.")[0]
    assert row["problem"] == "Compute $1+1$."
    assert row["prompt"] == [
        {"role": "system", "content": "Think."},
        {"role": "user", "content": f"Compute $1+1$. {DEFAULT_INSTRUCTION}"},
    ]
    assert row["answer"] == r"\frac{1}{2}"


def test_missing_or_misnamed_columns_name_the_fix(small: datasets.Dataset) -> None:
    with pytest.raises(KeyError, match="name it in the column mapping"):
        to_math_rows(small)
    with pytest.raises(KeyError, match="no answer column 'nope'"):
        to_math_rows(small, columns={"q": "problem", "nope": "answer"})
    with pytest.raises(ValueError, match="'problem' or 'answer'"):
        to_math_rows(small, columns={"q": "question"})
    with pytest.raises(FileNotFoundError):
        load_math_dataset("/nonexistent/gsm8k.jsonl")


def test_local_or_hub() -> None:
    assert is_local("data/train.jsonl") and is_local(DATA.parent) and not is_local("openai/gsm8k")
    assert not is_local("gsm8k")


def test_prompt_helpers() -> None:
    assert build_prompt("P", None, "Do it.") == [{"role": "user", "content": "P Do it."}]
    assert build_prompt("P", "S", None) == [{"role": "system", "content": "S"}, {"role": "user", "content": "P"}]
    assert problem_text([{"role": "system", "content": "x"}, {"role": "user", "content": "P Do it."}], "Do it.") == "P"
    with pytest.raises(ValueError):
        problem_text(3)


def test_config_loader_entry() -> None:
    path = _local("gsm8k/test.jsonl")
    cfg = SimpleNamespace(
        name="openai/gsm8k",
        path=str(path),
        config_name="main",
        split="test",
        columns={},
        system_prompt=None,
        instruction="Put your final answer after ####.",
    )
    dataset = load_math(cfg, seed=0)
    assert len(dataset) == 1319
    assert dataset[0]["prompt"][0]["content"].endswith("? Put your final answer after ####.")
    cfg.instruction = None
    assert load_math(cfg)[0]["prompt"][0]["content"].endswith(DEFAULT_INSTRUCTION)
    cfg.path = cfg.name = None
    with pytest.raises(ValueError, match="data.name"):
        load_math(cfg)
