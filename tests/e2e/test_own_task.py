"""Your own task with no Python, end to end (docs/your_task.md): a JSONL file and a recipe YAML written here,
trained with the real pipeline (`python -m agrpo`, TRL's AsyncGRPOTrainer, the session's real vLLM server and the
tiny model), evaluated with `agrpo eval`, and pushed with `agrpo push` to a fake Hub (the real one cannot be reached).

What it proves: every extra JSONL column reached the reward functions in TRL's scoring process with the values of
the row the prompt came from (a user reward loaded from a file path records what it got), a generic reward's value
follows a column (regex_match on `rx`: rows whose regex always matches score 1, the others 0, so mean@k is exactly
the share of such rows), and the pushed card holds that evaluation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from report.fake_model_hub import FAKE_TOKEN, NAMESPACE, FakeModelHub

from agrpo.inference.vllm_server import unload_adapters

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

LETTERS = "abcdefgh"

RECORDER = '''
import json


def record_columns(completions, prompts, record_to, **columns):
    """Scores nothing; writes down which columns arrived, for the test to compare with the JSONL rows."""
    seen = {key: value for key, value in columns.items() if key != "completion_ids"}
    with open(record_to, "a") as handle:
        handle.write(json.dumps({"prompt": prompts[0], "n": len(completions), "columns": seen}) + "\\n")
    return [0.0] * len(completions)
'''

RECIPE = """# @package _global_
# python -m agrpo +recipe=my_task.yaml
defaults:
  - override /model: tiny
  - override /data: jsonl
run_name: my_task
data:
  path: {train}
  prompt_template: "Q: {{question}}"
  system_prompt: Answer with one letter.
reward:
  funcs:
    - _target_: agrpo.rewards.generic.regex_match
      column: rx
      weight: 1.0
    - _target_: {recorder}:record_columns
      record_to: {seen}
      weight: 0.0
lora:
  r: 8
  alpha: 32
trainer:
  learning_rate: 5.0e-3
  max_steps: 3
  per_device_train_batch_size: 16
  num_generations: 8
  max_completion_length: 16
  max_staleness: 1
  token_budget: 0
  save_steps: 0
inference:
  max_model_len: 256
eval:
  path: {test}
  k: 2
"""


def task_rows(count: int, offset: int = 0) -> list[dict]:
    """Rows of a trivial task; `rx` is a regex that always matches on even items and never on odd ones."""
    return [
        {
            "question": f"Which letter is item {offset + i}? It is {LETTERS[i % 8]}.",
            "answer": LETTERS[i % 8],
            "item": offset + i,
            "rx": "" if i % 2 == 0 else "(?!)",
        }
        for i in range(count)
    ]


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def test_jsonl_to_trained_evaluated_pushed_adapter(vllm_server, tiny_model_dir, tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in task_rows(64)))
    test.write_text("".join(json.dumps(row) + "\n" for row in task_rows(8, offset=1000)))
    (tmp_path / "record.py").write_text(RECORDER)
    seen, run_dir = tmp_path / "seen.jsonl", tmp_path / "run"
    recipe = tmp_path / "my_task.yaml"
    recipe.write_text(RECIPE.format(train=train, test=test, recorder=tmp_path / "record.py", seen=seen))
    local = [f"inference.urls=[{vllm_server.url}]", f"model.name_or_path={tiny_model_dir}", "model.builder=null"]

    try:
        run(["-m", "agrpo", f"+recipe={recipe}", "role=trainer", *local, f"hydra.run.dir={run_dir}"])
    finally:
        unload_adapters(vllm_server.url)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 3 and (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()

    rows = {row["item"]: row for row in task_rows(64)}
    records = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(records) >= 6  # 2 prompts a step x 3 steps, each scored once per group of 8
    for record in records:
        columns = record["columns"]
        assert set(columns) == {"answer", "item", "rx", "question"}
        row = rows[columns["item"][0]]
        assert all(columns[key] == [row[key]] * record["n"] for key in ("answer", "item", "rx", "question"))
        assert record["prompt"] == [
            {"role": "system", "content": "Answer with one letter."},
            {"role": "user", "content": f"Q: {row['question']}"},
        ]

    run(
        [
            "-m",
            "agrpo",
            "eval",
            f"+recipe={recipe}",
            *local,
            f"eval.adapter={run_dir}/final_adapter",
            f"eval.output_dir={run_dir}/eval",
        ]
    )
    summary = json.loads((run_dir / "eval" / "eval_summary.json").read_text())
    assert (summary["problems"], summary["k"], summary["mean_at_k"], summary["problems_solved"]) == (8, 2, 0.5, 4)
    results = [json.loads(line) for line in (run_dir / "eval" / "eval_results.jsonl").read_text().splitlines()]
    assert [r["term_scores"]["regex_match"] for r in results] == [[1.0, 1.0], [0.0, 0.0]] * 4

    with FakeModelHub() as hub:
        run(
            ["-m", "agrpo.report.push", str(run_dir), "--repo-id", "my-task-lora"],
            HF_HUB_OFFLINE="0",
            HF_ENDPOINT=hub.url,
            HF_TOKEN=FAKE_TOKEN,
            NO_PROXY="127.0.0.1",
            no_proxy="127.0.0.1",
        )
        repo = hub.repos[f"{NAMESPACE}/my-task-lora"]
    card = repo.files["README.md"].decode()
    assert "| this adapter | 8 | 2 | 0.5000 | 0.5000 | 0.5000 | 4 |" in card
    assert "`agrpo.rewards.generic.regex_match` x 1.0" in card and "| optimizer steps | 3 |" in card
    assert (
        repo.files["adapter_model.safetensors"]
        == (run_dir / "final_adapter" / "adapter_model.safetensors").read_bytes()
    )
