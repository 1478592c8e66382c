"""Resume logic against a local directory standing in for the bucket (no Hub: it cannot be reached here).

Relaunching a run id must continue from the latest complete checkpoint and never reuse an adapter name.
"""

import json

from agrpo.sync.resume import inspect_run, prepare_resume, read_run_state
from agrpo.sync.storage import LocalDirStorage


def write(root, path, text="x"):
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def checkpoint(root, step, version, complete=True):
    write(
        root, f"checkpoint-{step}/rollout_state.json", json.dumps({"prompt_index": step * 2, "model_version": version})
    )
    write(root, f"checkpoint-{step}/adapter_model.safetensors")
    if complete:
        write(root, f"checkpoint-{step}/trainer_state.json", "{}")


def test_an_empty_run_directory_starts_from_scratch(tmp_path):
    state = prepare_resume(LocalDirStorage(tmp_path / "missing"))
    assert (state.checkpoint, state.published_version, state.stale, state.incomplete) == (None, 0, [], [])


def test_latest_complete_checkpoint_wins_and_a_cut_off_one_is_removed(tmp_path):
    checkpoint(tmp_path, 10, 10)
    checkpoint(tmp_path, 20, 20)
    checkpoint(tmp_path, 30, 30, complete=False)  # the Job died while saving it
    state = prepare_resume(LocalDirStorage(tmp_path))
    assert (state.checkpoint, state.checkpoint_version, state.incomplete) == ("checkpoint-20", 20, ["checkpoint-30"])
    assert not (tmp_path / "checkpoint-30").exists() and (tmp_path / "checkpoint-20").exists()


def test_version_floor_skips_every_name_published_after_the_checkpoint(tmp_path):
    checkpoint(tmp_path, 20, 20)
    for version in (21, 22, 23):
        write(tmp_path, f".vllm_lora/trl-policy-v{version}/adapter_config.json")
    write(tmp_path, ".vllm_lora/.trl-policy-v24.tmp/adapter_config.json")  # half-written by the killed attempt
    state = prepare_resume(LocalDirStorage(tmp_path))
    assert (state.checkpoint_version, state.published_version) == (20, 23)
    saved = json.loads((tmp_path / "checkpoint-20" / "rollout_state.json").read_text())
    assert saved == {"prompt_index": 40, "model_version": 23}  # next publish is v24, a name never served
    assert list((tmp_path / ".vllm_lora").iterdir()) == []
    assert read_run_state(LocalDirStorage(tmp_path)).checkpoint_version == 23  # idempotent on a second start


def test_a_checkpoint_already_past_the_published_versions_is_left_alone(tmp_path):
    checkpoint(tmp_path, 5, 5)
    write(tmp_path, ".vllm_lora/trl-policy-v4/adapter_config.json")
    before = (tmp_path / "checkpoint-5" / "rollout_state.json").read_text()
    prepare_resume(LocalDirStorage(tmp_path))
    assert (tmp_path / "checkpoint-5" / "rollout_state.json").read_text() == before


def test_inspect_run_reads_a_listing():
    listing = {
        "checkpoint-2/trainer_state.json": 2,
        "checkpoint-2/rollout_state.json": 40,
        "checkpoint-3/adapter_model.safetensors": 9,
        ".vllm_lora/trl-policy-v7/adapter_config.json": 1,
        ".vllm_lora/trl-policy-v12/adapter_model.safetensors": 1,
        "tensorboard/events": 5,
        "checkpoint-x/trainer_state.json": 1,
    }
    state = inspect_run(listing)
    assert state.checkpoint == "checkpoint-2" and state.incomplete == ["checkpoint-3"]
    assert state.published_version == 12
    assert state.stale == [".vllm_lora/trl-policy-v12", ".vllm_lora/trl-policy-v7"]


# --- trainer.resume for local runs: the same discovery as the bucket path -----------------------------------------

import pytest  # noqa: E402

from agrpo.errors import ConfigError  # noqa: E402
from agrpo.sync.resume import checkpoint_to_resume, resume_mode  # noqa: E402


@pytest.mark.parametrize(
    "value, expected",
    [
        (False, ("false", None)),
        ("false", ("false", None)),
        (True, ("true", None)),
        ("True", ("true", None)),
        ("auto", ("auto", None)),
        ("/runs/a/checkpoint-40", ("path", "/runs/a/checkpoint-40")),
    ],
)
def test_resume_mode_reads_booleans_words_and_paths(value, expected):
    assert resume_mode(value) == expected


def test_local_resume_skips_a_cut_off_checkpoint_and_floors_versions(tmp_path):
    """Killed at step 50 with checkpoint-40 saved and v42..v51 published on a server that still runs: resume from
    checkpoint-40, but the next adapter name must come after v51."""
    checkpoint(tmp_path, 40, version=41)
    checkpoint(tmp_path, 50, version=51, complete=False)  # cut off mid-save
    for version in range(42, 52):
        write(tmp_path, f".vllm_lora/trl-policy-v{version}/adapter_config.json", "{}")
    chosen = checkpoint_to_resume("true", str(tmp_path))
    assert chosen == str(tmp_path / "checkpoint-40")
    assert json.loads((tmp_path / "checkpoint-40/rollout_state.json").read_text()) == {
        "prompt_index": 80,
        "model_version": 51,
    }
    assert not (tmp_path / "checkpoint-50").exists()


def test_auto_starts_fresh_without_a_checkpoint_and_true_refuses(tmp_path):
    assert checkpoint_to_resume("auto", str(tmp_path)) is None
    assert checkpoint_to_resume("false", str(tmp_path)) is None
    with pytest.raises(ConfigError, match="trainer.resume=auto"):
        checkpoint_to_resume("true", str(tmp_path))


def test_an_explicit_checkpoint_path_must_be_complete(tmp_path):
    checkpoint(tmp_path, 10, version=11)
    checkpoint(tmp_path, 20, version=21, complete=False)
    assert checkpoint_to_resume(str(tmp_path / "checkpoint-10"), str(tmp_path)) == str(tmp_path / "checkpoint-10")
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        checkpoint_to_resume(str(tmp_path / "checkpoint-20"), str(tmp_path))


def test_an_older_checkpoint_chosen_by_path_gets_the_version_floor(tmp_path):
    checkpoint(tmp_path, 10, version=11)
    checkpoint(tmp_path, 20, version=21)
    write(tmp_path, ".vllm_lora/trl-policy-v25/adapter_config.json", "{}")
    checkpoint_to_resume(str(tmp_path / "checkpoint-10"), str(tmp_path))
    assert json.loads((tmp_path / "checkpoint-10/rollout_state.json").read_text())["model_version"] == 25
    assert not list((tmp_path / ".vllm_lora").iterdir())
