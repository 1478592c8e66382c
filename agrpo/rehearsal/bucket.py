"""The stand-in's bucket listing (pure): a file written to the bucket folder shows in the listing only `lag_s` after
the stand-in first saw it, like the Hub's listing trailing an upload; a path looked up (listed by exact prefix)
before it was visible stays invisible for `negative_cache_s`, like the mount's negative-lookup cache, so a caller
that asks too early is punished the way a replica's mount punishes it.

`Visibility.visible(path, now)` decides one path; the server feeds it what it finds on disk (times: wall-clock
seconds, a file's first sighting is its modification time). Lookups come from the gateway: a replica asked to load
an adapter whose adapter_config.json its mount cannot show yet answers as vLLM does for a missing path.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Visibility:
    lag_s: float = 1.0
    negative_cache_s: float = 30.0
    first_seen: dict[str, float] = field(default_factory=dict)  # path -> when the stand-in first found it on disk
    missed: dict[str, float] = field(default_factory=dict)  # path -> when it was looked up while invisible

    def seen(self, path: str, now: float, preexisting: bool = False) -> None:
        """Record a file found on disk; `preexisting` (uploaded through the API, or there before) shows at once."""
        if path not in self.first_seen:
            self.first_seen[path] = now - (self.lag_s if preexisting else 0.0)

    def visible(self, path: str, now: float) -> bool:
        seen = self.first_seen.get(path)
        if seen is None or now - seen < self.lag_s:
            return False
        missed = self.missed.get(path)
        return missed is None or now - missed >= self.negative_cache_s

    def lookup(self, path: str, now: float) -> bool:
        """An exact-path lookup: when it misses, the miss is cached (the first miss starts the window)."""
        if self.visible(path, now):
            return True
        self.missed.setdefault(path, now)
        return False


def listing(files: dict[str, int], prefix: str, view: Visibility, now: float) -> list[dict]:
    """The tree listing huggingface_hub's list_bucket_tree parses: visible files under `prefix`."""
    prefix = prefix.strip("/")
    found = []
    for path, size in sorted(files.items()):
        if prefix and not (path == prefix or path.startswith(prefix + "/")):
            continue
        if view.visible(path, now):
            found.append(
                {"type": "file", "path": path, "size": size, "xetHash": "0" * 64, "mtime": "2026-01-01T00:00:00.000Z"}
            )
    return found
