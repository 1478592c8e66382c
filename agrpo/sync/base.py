"""The adapter-store interface. The trainer publishes `<output_dir>/.vllm_lora/trl-policy-vN` (TRL writes it with an
atomic rename); before the replicas are asked to load it, the store waits until they can see it. A shared local
directory is visible at once; a bucket mount is not (its listing lags), which is why this hook exists.

A new kind is a module `agrpo/sync/<kind>.py` whose store class is registered with `@register`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from agrpo.plugins import lookup

STORES: dict[str, type["AdapterStore"]] = {}


class AdapterStore(ABC):
    kind: str

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @abstractmethod
    def wait_until_visible(self, adapter_dir: str, timeout_s: float) -> None:
        """Return once every replica can read `adapter_dir`; raise TimeoutError after `timeout_s`."""


def register(cls: type[AdapterStore]) -> type[AdapterStore]:
    STORES[cls.kind] = cls
    return cls


def get_store(cfg: Any) -> AdapterStore:
    return lookup(STORES, "agrpo.sync", cfg.sync.kind, "sync.kind")(cfg)
