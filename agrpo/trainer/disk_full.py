"""A full disk under the run's folder ends the run with one paragraph: which folder, how much space the run needs
there, and the knobs that make it need less.

Before: exit 1 after 65 lines of chained tracebacks (peft, safetensors, TRL's sync, the trainer), none naming the
folder. What fills it: every published adapter version (`<output_dir>/.vllm_lora/trl-policy-vN`, kept while a request
for it can still be inside a replica: agrpo/trainer/sync/retention.py) and the checkpoints
(`trainer.save_total_limit` of them). The figures are read when the error happens (pure message, I/O apart).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXT = ("No space left on device", "Disk quota exceeded")
LORA_DIR = ".vllm_lora"


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def disk_full_cause(error: BaseException) -> BaseException | None:
    """The exception in `error`'s chain that says the disk is full (an OSError with ENOSPC/EDQUOT, or a library's
    own error carrying the OS's words: safetensors and torch wrap it), or None."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in FULL_ERRNOS:
            return link
    for link in _chain(error):
        if any(text in str(link) for text in FULL_TEXT):
            return link
    return None


def size_text(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@dataclass
class DiskFigures:
    folder: str  # the run's output folder (sync.output_dir)
    free_bytes: int | None
    version_bytes: int  # one adapter version (the newest complete one)
    versions_kept: int
    checkpoint_bytes: int  # one checkpoint (the newest)
    checkpoints_kept: int
    checkpoint_limit: int | None  # trainer.save_total_limit


def disk_full_message(figures: DiskFigures, cause: BaseException) -> str:
    """The paragraph (pure)."""
    f = figures
    where = getattr(cause, "filename", None)
    writing = f" writing {where}" if where else ""
    free = f" ({size_text(f.free_bytes)} free)" if f.free_bytes is not None else ""
    versions = f.version_bytes * (f.versions_kept + 1)  # what is kept, and the one being written
    checkpoints = f.checkpoint_bytes * ((f.checkpoint_limit or max(f.checkpoints_kept, 1)) + 1)
    kept = (
        f"it keeps {f.versions_kept} adapter versions of {size_text(f.version_bytes)} each in {f.folder}/{LORA_DIR} "
        f"(a version is kept while a request for it can still be in a replica: inference.adapter_retention_s)"
    )
    if f.checkpoint_bytes:
        limit = "all" if f.checkpoint_limit is None else str(f.checkpoint_limit)
        kept += f" and {limit} checkpoints of {size_text(f.checkpoint_bytes)} each (trainer.save_total_limit)"
    return (
        f"the disk holding the run folder {f.folder} is full{free}: No space left on device{writing}. The run "
        f"needs about {size_text(versions + checkpoints)} free there: {kept}. Free space on that disk, point "
        "hydra.run.dir (sync.output_dir) at a larger one, keep fewer versions with a lower "
        "inference.adapter_retention_s, or fewer checkpoints with trainer.save_total_limit"
    )


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _newest(folders: list[Path], number: str) -> Path | None:
    complete = [p for p in folders if p.is_dir() and not p.name.startswith(".")]
    return max(complete, key=lambda p: int(p.name.rsplit(number, 1)[-1] or 0), default=None)


def disk_figures(output_dir: str | Path, checkpoint_limit: int | None) -> DiskFigures:
    """The figures of a run folder now (best effort: a folder that cannot be read counts as empty)."""
    root = Path(output_dir)
    try:
        free: int | None = shutil.disk_usage(root).free
    except OSError:
        free = None
    try:
        versions = [p for p in (root / LORA_DIR).iterdir() if p.name.split("-v")[-1].isdigit()]
        checkpoints = [p for p in root.iterdir() if p.name.startswith("checkpoint-") and p.name[11:].isdigit()]
        newest_version, newest_checkpoint = _newest(versions, "-v"), _newest(checkpoints, "-")
        version_bytes = _folder_bytes(newest_version) if newest_version else 0
        checkpoint_bytes = _folder_bytes(newest_checkpoint) if newest_checkpoint else 0
    except OSError:
        versions, checkpoints, version_bytes, checkpoint_bytes = [], [], 0, 0
    return DiskFigures(
        str(root), free, version_bytes, len(versions), checkpoint_bytes, len(checkpoints), checkpoint_limit
    )
