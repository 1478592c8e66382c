"""Bucket storage: what a run directory holds, seen as a flat listing of files (path -> size).

Two implementations of one small interface, so resume logic and the "is this adapter visible yet" wait are written
once and tested against a local directory:
- `LocalDirStorage`: a plain directory (sync=shared_dir, tests, and a bucket seen through its own mount).
- `HubBucketStorage`: a Storage Bucket whose *listing* comes from the Hub API, which is what decides whether a
  replica's mount can see a file. Contents are read and written through the mount (the trainer Job mounts it
  read-write), so no upload client is needed.
"""

from __future__ import annotations

import os
import shutil
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable


class BucketStorage(ABC):
    """Files under one root, addressed by '/'-separated paths relative to it."""

    @abstractmethod
    def list_files(self, prefix: str = "") -> dict[str, int]:
        """Every file under `prefix` (recursively) as {relative path: size in bytes}."""

    @abstractmethod
    def read_text(self, path: str) -> str:
        """The text of one file (FileNotFoundError if absent)."""

    @abstractmethod
    def write_text(self, path: str, text: str) -> None:
        """Write one file, replacing it whole (a reader never sees half of it)."""

    @abstractmethod
    def delete_tree(self, prefix: str) -> None:
        """Remove a file or folder and everything under it; absent is fine."""


class LocalDirStorage(BucketStorage):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def _path(self, path: str) -> Path:
        return self.root / path if path else self.root

    def list_files(self, prefix: str = "") -> dict[str, int]:
        base = self._path(prefix)
        if base.is_file():
            return {prefix: base.stat().st_size}
        found = {}
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                try:
                    found[full.relative_to(self.root).as_posix()] = full.stat().st_size
                except FileNotFoundError:  # removed while listing
                    continue
        return found

    def read_text(self, path: str) -> str:
        return self._path(path).read_text()

    def write_text(self, path: str, text: str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, target)

    def delete_tree(self, prefix: str) -> None:
        target = self._path(prefix)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()


class HubBucketStorage(BucketStorage):
    """A bucket listed through the Hub API (`HfApi.list_bucket_tree`), read and written through its mount.

    `root` is the folder inside the bucket this storage addresses (e.g. the run id); `mount_dir` is where that same
    folder appears on this machine's mount.
    """

    def __init__(self, api: Any, bucket_id: str, root: str, mount_dir: str | os.PathLike):
        self.api, self.bucket_id, self.root = api, bucket_id, root.strip("/")
        self.mount = LocalDirStorage(mount_dir)

    def list_files(self, prefix: str = "") -> dict[str, int]:
        full = "/".join(part for part in (self.root, prefix.strip("/")) if part)
        cut = len(self.root) + 1 if self.root else 0
        found = {}
        for item in self.api.list_bucket_tree(self.bucket_id, prefix=full or None, recursive=True):
            if getattr(item, "type", "file") == "file" and item.path.startswith(self.root):
                found[item.path[cut:]] = int(item.size)
        return found

    def read_text(self, path: str) -> str:
        return self.mount.read_text(path)

    def write_text(self, path: str, text: str) -> None:
        self.mount.write_text(path, text)

    def delete_tree(self, prefix: str) -> None:
        self.mount.delete_tree(prefix)


def missing_files(expected: dict[str, int], listed: dict[str, int]) -> list[str]:
    """Paths of `expected` that `listed` lacks or shows with another size (an upload still in flight)."""
    return sorted(path for path, size in expected.items() if listed.get(path) != size)


def wait_until_listed(
    storage: BucketStorage,
    prefix: str,
    expected: dict[str, int],
    timeout_s: float,
    poll_interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll `storage`'s listing of `prefix` until every expected file is there whole; return the number of polls.

    Raises TimeoutError naming the files still missing after `timeout_s`.
    """
    deadline = clock() + timeout_s
    polls = 0
    while True:
        polls += 1
        missing = missing_files(expected, storage.list_files(prefix))
        if not missing:
            return polls
        if clock() >= deadline:
            raise TimeoutError(
                f"after {timeout_s:.0f} s the bucket listing still lacks {missing} (polled {polls} times)"
            )
        sleep(poll_interval_s)
