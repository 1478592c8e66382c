"""sync=shared_dir: a directory every replica reads at the same absolute path (local disk, NFS). TRL's atomic
rename makes a published adapter visible whole and at once, so there is nothing to wait for."""

from __future__ import annotations

import os

from agrpo.sync.base import AdapterStore, register


@register
class SharedDirStore(AdapterStore):
    kind = "shared_dir"

    def wait_until_visible(self, adapter_dir: str, timeout_s: float) -> None:
        if not os.path.isfile(os.path.join(adapter_dir, "adapter_config.json")):
            raise FileNotFoundError(f"{adapter_dir} was not published (no adapter_config.json)")
