"""`AgrpoVLLMClient`: TRL's `VLLMClient` (the trainer's HTTP client for adapter loads) as agrpo's adapter sync uses it.

TRL's `load_lora_adapter` posts the load and returns when the server answered; `unload_lora_adapter` posts the unload.
agrpo's load is one call chain, in this order (formerly three wrappers whose install order mattered):

1. wait until the adapter store shows the published folder to the replicas (`sync.visibility_gate`: a bucket lists
   a new folder late; agrpo/sync/), recording `sync/visible_s`;
2. the load itself: TRL's, or behind the proxy with `sync.mode=background` the proxy's `serve=first` form, answered
   as soon as one replica serves the version (the others catch up; agrpo/proxy/availability.py);
3. the retention policy learns the version is loaded (agrpo/trainer/sync/retention.py), and with the blocking sync
   `sync/publish_to_loaded_s` is recorded (the background thread measures its own).

An unload first tells the retention policy when the version was unloaded (its folder outlives the unload by as long as
a request for it can still be inside an engine). Every call carries the admin token through TRL's module `requests`
(agrpo/trainer/seam/module_patches.py: TRL's client has no way to add a header).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trl.experimental.async_grpo import vllm_client as trl_client
from trl.experimental.async_grpo.vllm_client import VLLMClient

SERVE_FIRST_QUERY = "serve=first"  # agrpo/proxy/availability.py; a single vLLM server ignores it
Record = Callable[[str, float], None]  # (metric key, value) into the trainer's metrics or the sync thread's queue


@dataclass(frozen=True)
class Visibility:
    """Wait until `store` shows a published adapter folder to the replicas, recording how long that took."""

    store: Any
    timeout_s: float
    record: Record

    def wait(self, path: str) -> None:
        start = time.monotonic()
        self.store.wait_until_visible(path, self.timeout_s)
        self.record("sync/visible_s", time.monotonic() - start)


class AgrpoVLLMClient(VLLMClient):
    """TRL's vLLM client whose adapter loads wait for the store, can be served-first, and feed the retention policy."""

    def __init__(self, server_url: str, server_timeout: float = 240.0):
        """TRL's client; agrpo adds how later loads go (`load_through`: the store's visibility, the proxy's
        serve-first answer) and the retention policy they feed, which TRL's loads know nothing of."""
        super().__init__(server_url, server_timeout)
        self.visibility: Visibility | None = None
        self.serve_first = False
        self.loaded_record: Record | None = None
        self.retention: Any = None  # AdapterRetention while the trainer trains with it

    def load_through(
        self, visibility: Visibility | None, *, serve_first: bool = False, loaded_record: Record | None = None
    ) -> None:
        """How every later load goes: the store's visibility first (None: `sync.visibility_gate=false`), the
        proxy's serve-first load, and where to record `sync/publish_to_loaded_s` (the blocking sync only)."""
        self.visibility, self.serve_first, self.loaded_record = visibility, serve_first, loaded_record

    def retain_with(self, retention: Any) -> None:
        """Report loads and unloads to `retention` (an AdapterRetention; None: no longer)."""
        self.retention = retention

    def load_lora_adapter(self, lora_name: str, lora_path: str, timeout: int = 1800) -> None:
        """TRL: post the load, return when the server answered. agrpo: the chain of the module docstring."""
        start = time.monotonic()
        if self.visibility is not None:
            self.visibility.wait(lora_path)
        if self.serve_first:
            self._load_serving_first(lora_name, lora_path, timeout)
        else:
            super().load_lora_adapter(lora_name, lora_path, timeout)
        if self.retention is not None and (version := self.retention.version_of(lora_path)) is not None:
            self.retention.loaded(version)
        if self.loaded_record is not None:
            self.loaded_record("sync/publish_to_loaded_s", time.monotonic() - start)

    def unload_lora_adapter(self, lora_name: str, timeout: int = 1800) -> None:
        """TRL: post the unload. agrpo: the retention policy notes when (its folder's deletion counts from then)."""
        retention = self.retention
        if retention is not None:
            version = retention.version_served(lora_name)  # `<tenant>/trl-policy-vN` on a shared fleet
            if version is not None:
                retention.unloaded(version)
        super().unload_lora_adapter(lora_name, timeout)

    def _load_serving_first(self, lora_name: str, lora_path: str, timeout: int) -> None:
        """TRL's load request, asking the proxy to answer once one replica serves the adapter."""
        response = trl_client.requests.post(  # TRL's module `requests`: it carries the admin token when set
            f"{self.server_url}/v1/load_lora_adapter?{SERVE_FIRST_QUERY}",
            json={"lora_name": lora_name, "lora_path": lora_path, "load_inplace": False},
            timeout=timeout,
        )
        if response.status_code != 200:
            raise RuntimeError(f"loading {lora_name} failed: HTTP {response.status_code}, {response.text[:500]}")
