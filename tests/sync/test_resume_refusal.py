"""A checkpoint whose rollout_state.json cannot be read refuses the resume with one paragraph naming the file (never a
traceback, never a guess: prompt 0 and v0 would retrain seen prompts and reuse adapter names), and nothing in the run
directory is deleted before it does."""

from __future__ import annotations

import json

import pytest

from agrpo.errors import ConfigError
from agrpo.sync.resume import checkpoint_to_resume


@pytest.mark.parametrize(
    ("saved", "reason"),
    [
        ("[1]", "the record is an array, not an object"),
        ('{"model_version": NaN, "prompt_index": 4}', "NaN is not a finite number"),
        ('{"model_version": "7", "prompt_index": 4}', "model_version is a string, not a number"),
        ('{"model_version": 7, "prompt_ind', "not JSON"),
    ],
)
def test_a_bad_rollout_state_refuses_naming_the_file(tmp_path, saved, reason):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    (folder / "rollout_state.json").write_text(saved)
    (tmp_path / ".vllm_lora" / "trl-policy-v9").mkdir(parents=True)
    with pytest.raises(ConfigError) as refused:
        checkpoint_to_resume("auto", str(tmp_path))
    text = str(refused.value)
    assert text.startswith(f"{tmp_path}/checkpoint-4/rollout_state.json cannot be read: {reason}")
    assert "could reuse an adapter name" in text and "trainer.resume=" in text and "\n" not in text
    assert (tmp_path / ".vllm_lora" / "trl-policy-v9").is_dir()  # refused before anything was removed
    assert (folder / "rollout_state.json").read_text() == saved


def test_a_good_rollout_state_keeps_its_other_fields(tmp_path):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    (folder / "rollout_state.json").write_text('{"model_version": 2, "prompt_index": 4, "extra": [1]}')
    (tmp_path / ".vllm_lora" / "trl-policy-v9").mkdir(parents=True)
    (tmp_path / ".vllm_lora" / "trl-policy-v9" / "adapter_config.json").write_text("{}")
    assert checkpoint_to_resume("auto", str(tmp_path)) == str(folder)
    saved = json.loads((folder / "rollout_state.json").read_text())
    assert saved == {"model_version": 9, "prompt_index": 4, "extra": [1]}
