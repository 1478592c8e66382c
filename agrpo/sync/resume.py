"""Resume a run from what its directory (a bucket folder, or any BucketStorage) already holds.

Relaunching the same run id must continue, not restart, and must never reuse an adapter name: vLLM keys its
prefix cache by adapter name, and replicas of the previous attempt may still hold every version it published,
including versions newer than the last checkpoint. So before the trainer starts:
1. find the latest complete checkpoint-N (TRL resumes from it and reads the adapter version from its
   rollout_state.json);
2. raise that saved version to the highest version ever published under .vllm_lora, so the next name is new;
3. delete .vllm_lora (stale adapters, half-written temp folders of a killed attempt) and checkpoints cut off
   mid-write (the trainer would otherwise pick the highest checkpoint-N and fail on it).

A rollout_state.json that cannot be read (not JSON, not an object, a version that is not a whole number: see
agrpo/interprocess.py) refuses the resume with one paragraph naming the file, instead of a traceback or a guess:
restarting its data position at prompt 0 or its versions at v0 would retrain seen prompts and reuse adapter names.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from agrpo.errors import ConfigError
from agrpo.interprocess import BadInput, integer, parse_record, record, refusal
from agrpo.sync.storage import BucketStorage

log = logging.getLogger(__name__)

LORA_DIR = ".vllm_lora"
ROLLOUT_STATE = "rollout_state.json"
# Written last by transformers' checkpoint save: a checkpoint without it was cut off mid-write.
COMPLETE_MARKER = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
ADAPTER_VERSION = re.compile(r"-v(\d+)$")
SAVED_STATE = record({"model_version": integer, "prompt_index": integer}, keep_unknown=True)


def _where(storage: BucketStorage, path: str) -> str:
    root = getattr(storage, "root", "")
    return f"{root}/{path}" if root else path


def read_saved_state(storage: BucketStorage, path: str) -> dict[str, Any]:
    """A checkpoint's rollout_state.json, typed; FileNotFoundError when there is none; ConfigError (one paragraph
    naming the file) when it cannot be read."""
    text = storage.read_text(path)
    try:
        return parse_record(text, SAVED_STATE)
    except BadInput as error:
        checkpoint = path.split("/")[0]
        raise ConfigError(
            refusal(
                _where(storage, path),
                error,
                "Resuming from it would restart the data at an unknown prompt and could reuse an adapter name a "
                "replica still holds",
                f"restore the file, resume from another complete checkpoint (trainer.resume=<its folder>), or move "
                f"{checkpoint} aside and use trainer.resume=auto",
            )
        ) from None


@dataclass
class RunState:
    """What a run directory holds, as far as resuming is concerned (paths relative to the run directory)."""

    checkpoint: str | None = None  # latest complete checkpoint-N folder
    checkpoint_version: int = 0  # adapter version saved in its rollout_state.json
    published_version: int = 0  # highest trl-policy-vN ever found under .vllm_lora
    stale: list[str] = field(default_factory=list)  # top-level entries of .vllm_lora to delete
    incomplete: list[str] = field(default_factory=list)  # checkpoint-N folders without trainer_state.json


def inspect_run(listing: dict[str, int]) -> RunState:
    """What a listing {path: size} says: latest complete checkpoint, highest published version, what to delete."""
    complete, seen = {}, {}
    entries, published = set(), 0
    for path in listing:
        parts = path.split("/")
        match = CHECKPOINT.fullmatch(parts[0])
        if match and len(parts) >= 2:
            seen[int(match.group(1))] = parts[0]
            if parts[1:] == [COMPLETE_MARKER]:
                complete[int(match.group(1))] = parts[0]
        if parts[0] == LORA_DIR and len(parts) >= 2:
            entries.add(f"{LORA_DIR}/{parts[1]}")
            version = ADAPTER_VERSION.search(parts[1])
            if version and not parts[1].startswith("."):
                published = max(published, int(version.group(1)))
    latest = max(complete) if complete else -1
    incomplete = [seen[n] for n in sorted(seen) if n > latest and n not in complete]
    return RunState(
        checkpoint=complete.get(latest), published_version=published, stale=sorted(entries), incomplete=incomplete
    )


def read_run_state(storage: BucketStorage) -> RunState:
    state = inspect_run(storage.list_files())
    checkpoint = state.checkpoint
    if checkpoint is not None:
        try:
            saved = read_saved_state(storage, f"{checkpoint}/{ROLLOUT_STATE}")
            state.checkpoint_version = saved.get("model_version", 0)
        except FileNotFoundError:
            state.checkpoint_version = 0
    return state


def raise_version_floor(storage: BucketStorage, checkpoint: str, published_version: int) -> None:
    """Make `checkpoint` continue adapter versions after `published_version` (written before anything is deleted:
    the floor must survive a crash right after)."""
    path = f"{checkpoint}/{ROLLOUT_STATE}"
    try:
        saved = read_saved_state(storage, path)
    except FileNotFoundError:
        saved = {"prompt_index": 0}
        log.warning("%s has no %s: the data position restarts at prompt 0", checkpoint, ROLLOUT_STATE)
    if published_version <= saved.get("model_version", 0):
        return
    log.info(
        "adapter versions continue after v%d (published before the restart), not v%d (checkpoint)",
        published_version,
        saved.get("model_version", 0),
    )
    saved["model_version"] = published_version
    storage.write_text(path, json.dumps(saved))


def prepare_resume(storage: BucketStorage, checkpoint: str | None = None) -> RunState:
    """Make the run directory ready for a (re)start from its latest complete checkpoint, or from `checkpoint` (a
    folder name in it); return what was found. Idempotent."""
    state = read_run_state(storage)
    if checkpoint is not None:
        state.checkpoint = checkpoint
    if state.checkpoint is not None:
        raise_version_floor(storage, state.checkpoint, state.published_version)
    for entry in [*state.stale, *state.incomplete]:
        storage.delete_tree(entry)
    if state.incomplete:
        log.warning("removed checkpoints cut off mid-write: %s", state.incomplete)
    if state.stale:
        log.info("removed %d stale entries of %s", len(state.stale), LORA_DIR)
    return state


# trainer.resume's words (YAML booleans count as theirs); anything else is a checkpoint path.
RESUME_FLAGS = {
    "false": "false",
    "no": "false",
    "0": "false",
    "none": "false",
    "null": "false",
    "": "false",
    "true": "true",
    "yes": "true",
    "1": "true",
    "auto": "auto",
}


def resume_mode(value: Any) -> tuple[str, str | None]:
    """`trainer.resume` read as ("false" | "true" | "auto" | "path", checkpoint path or None). YAML booleans count
    as their words, so `trainer.resume=true` and a Jobs requeue setting True both mean "true"."""
    text = str(value).strip()
    mode = RESUME_FLAGS.get(text.lower())
    if mode is not None:
        return mode, None
    return "path", text


def checkpoint_to_resume(resume: Any, output_dir: str) -> str | None:
    """The checkpoint folder this start resumes from, after making `output_dir` ready for it (the same discovery as
    a bucket: complete checkpoints only, adapter versions raised past every version already published, stale
    adapter folders and half-written checkpoints removed). None: start from scratch.

    "true" insists on a checkpoint, "auto" takes one if there is one, a path names the checkpoint (its version
    floor is applied only when it lies in `output_dir`, the folder whose adapters a running server may hold)."""
    from pathlib import Path

    from agrpo.sync.storage import LocalDirStorage

    mode, path = resume_mode(resume)
    if mode == "false":
        return None
    if mode == "path":
        checkpoint = Path(path).expanduser().resolve()
        if not (checkpoint / COMPLETE_MARKER).is_file():
            raise ConfigError(
                f"trainer.resume={path!r} is not a complete checkpoint folder (no {COMPLETE_MARKER}); "
                f"give a checkpoint-N folder, or trainer.resume=auto for the latest one in {output_dir}"
            )
        if checkpoint.parent == Path(output_dir).resolve():
            prepare_resume(LocalDirStorage(output_dir), checkpoint=checkpoint.name)
        return str(checkpoint)
    state = prepare_resume(LocalDirStorage(output_dir))
    if state.checkpoint is None:
        if mode == "true":
            raise ConfigError(
                f"trainer.resume=true but {output_dir} holds no complete checkpoint-N; use "
                "trainer.resume=auto to start from scratch when there is none"
            )
        return None
    return str(Path(output_dir) / state.checkpoint)
