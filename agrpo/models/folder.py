"""Built model folders: written whole or not at all, and reused only when built from the same spec.

A builder (tiny model, GGUF conversion) saves into a staging folder beside the target, writes a marker holding its
spec last, then renames the staging folder into place. A folder without the marker is an interrupted build, and a
folder with another spec is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def folder_matches(output_dir: Path, marker: str, spec: dict[str, Any]) -> bool:
    try:
        return json.loads((output_dir / marker).read_text()) == spec
    except (OSError, ValueError):
        return False


def save_model_folder(model: Any, tokenizer: Any, output_dir: Path, marker: str, spec: dict[str, Any]) -> Path:
    """Save `model` and `tokenizer` to `output_dir` atomically (concurrent builders never see half a folder)."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}-", dir=output_dir.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / marker).write_text(json.dumps(spec, sort_keys=True))
    if folder_matches(output_dir, marker, spec):  # a concurrent run built it first and may be reading it: keep it
        shutil.rmtree(staging, ignore_errors=True)
        return output_dir
    shutil.rmtree(output_dir, ignore_errors=True)
    os.replace(staging, output_dir)
    return output_dir
