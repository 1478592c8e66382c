"""Adapter names the proxy must no longer serve, and the answer a request naming one gets. No I/O here.

A version the trainer unloaded is *retired*: no replica holds it any more, so a request naming it (one that failed
over from a replica that died, one retried by a client) can never be served. It gets `410 Gone` at once instead of
a 404 from some replica that the client would retry for minutes. A version whose all-or-nothing load failed is
*retracted*: a replica that answered that load too late (after the broadcast timeout) may hold it, so it is unloaded
from a replica before the replica is admitted again.
"""

from __future__ import annotations

import json
from collections import OrderedDict

RETIRED_STATUS = 410  # agrpo's rollout worker drops a rollout answered this, without retrying (agrpo/trainer)
RETIRED_TYPE = "AdapterRetired"


class RecentNames:
    """A set of names that remembers only the `capacity` most recently added (bounded memory)."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._names: OrderedDict[str, None] = OrderedDict()

    def add(self, name: str) -> None:
        self._names[name] = None
        self._names.move_to_end(name)
        while len(self._names) > self.capacity:
            self._names.popitem(last=False)

    def discard(self, name: str) -> None:
        self._names.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


def retired_body(model: str) -> bytes:
    """vLLM's error shape: why the request cannot be served, and that retrying will not help."""
    message = (
        f"adapter {model!r} was retired: it was unloaded from every replica (a newer policy version replaced it), "
        "so no replica can serve this request; drop it, retrying cannot succeed"
    )
    return json.dumps({"error": {"message": message, "type": RETIRED_TYPE, "code": RETIRED_STATUS}}).encode()


def listed_models(models_body: bytes) -> list[str]:
    """The model ids (base model and adapters) of a vLLM `/v1/models` answer; [] when it is not one."""
    try:
        data = json.loads(models_body)["data"]
        return [entry["id"] for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        return []
