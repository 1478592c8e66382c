"""sync=shared_dir: a directory every replica reads at the same absolute path (local disk, NFS). TRL's atomic
rename makes a published adapter visible whole and at once, so there is nothing to wait for."""

from __future__ import annotations

from agrpo.sync.base import AdapterStore, register
from agrpo.sync.storage import LocalDirStorage


@register
class SharedDirStore(AdapterStore):
    kind = "shared_dir"

    def wait_until_visible(self, adapter_dir: str, timeout_s: float) -> None:
        if "adapter_config.json" not in LocalDirStorage(adapter_dir).list_files():
            raise FileNotFoundError(f"{adapter_dir} was not published (no adapter_config.json)")
