"""Resume a run from what its directory (a bucket folder, or any BucketStorage) already holds.

Relaunching the same run id must continue, not restart, and must never reuse an adapter name: vLLM keys its
prefix cache by adapter name, and replicas of the previous attempt may still hold every version it published,
including versions newer than the last checkpoint. So before the trainer starts:
1. find the latest complete checkpoint-N (TRL resumes from it and reads the adapter version from its
   rollout_state.json);
2. raise that saved version to the highest version ever published under .vllm_lora, so the next name is new;
3. delete .vllm_lora (stale adapters, half-written temp folders of a killed attempt) and checkpoints cut off
   mid-write (the trainer would otherwise pick the highest checkpoint-N and fail on it).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from agrpo.sync.storage import BucketStorage

log = logging.getLogger(__name__)

LORA_DIR = ".vllm_lora"
ROLLOUT_STATE = "rollout_state.json"
# Written last by transformers' checkpoint save: a checkpoint without it was cut off mid-write.
COMPLETE_MARKER = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
ADAPTER_VERSION = re.compile(r"-v(\d+)$")


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
    return RunState(checkpoint=complete.get(latest), published_version=published, stale=sorted(entries),
                    incomplete=incomplete)


def read_run_state(storage: BucketStorage) -> RunState:
    state = inspect_run(storage.list_files())
    checkpoint = state.checkpoint
    if checkpoint is not None:
        try:
            state.checkpoint_version = int(json.loads(storage.read_text(f"{checkpoint}/{ROLLOUT_STATE}"))
                                           .get("model_version", 0))
        except FileNotFoundError:
            state.checkpoint_version = 0
    return state


def prepare_resume(storage: BucketStorage) -> RunState:
    """Make the run directory ready for a (re)start; return what was found. Idempotent."""
    state = read_run_state(storage)
    if state.checkpoint is not None and state.published_version > state.checkpoint_version:
        path = f"{state.checkpoint}/{ROLLOUT_STATE}"
        try:
            saved = json.loads(storage.read_text(path))
        except FileNotFoundError:
            saved = {"prompt_index": 0}
            log.warning("%s has no %s: the data position restarts at prompt 0", state.checkpoint, ROLLOUT_STATE)
        saved["model_version"] = state.published_version
        storage.write_text(path, json.dumps(saved))  # before deleting: the floor must survive a crash right after
        log.info("adapter versions continue after v%d (published before the restart), not v%d (checkpoint)",
                 state.published_version, state.checkpoint_version)
    for entry in [*state.stale, *state.incomplete]:
        storage.delete_tree(entry)
    if state.incomplete:
        log.warning("removed checkpoints cut off mid-write: %s", state.incomplete)
    if state.stale:
        log.info("removed %d stale entries of %s", len(state.stale), LORA_DIR)
    return state
