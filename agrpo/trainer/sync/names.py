"""The two names of a published adapter version (pure): its folder and the name vLLM serves it under.

TRL 1.16 uses one name for both (`AsyncGRPOTrainer._lora_name = "trl-policy"`: the folder
`<output_dir>/.vllm_lora/trl-policy-vN` and the served `trl-policy-vN`). On a shared fleet the served name carries the
run's namespace, `<tenant>/trl-policy-vN` (agrpo/fleet/tenancy.py), so two runs never share a served name, while the
folder keeps its plain name (resume, retention and disk checks read folders). agrpo's sync, retention and rollout
worker take the served base from here; TRL's blocking sync, which knows only `_lora_name`, is refused on a shared fleet
(agrpo/trainer/seam/trainer.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agrpo.fleet.tenancy import ADAPTER_BASE, served_adapter_name


def served_base(folder_base: str, tenant: str | None) -> str:
    """What the rollout worker puts before `-vN` in a request's `model` (agrpo's rollout loop, as TRL's worker did:
    `f"{lora_name}-v{N}"`, agrpo/trainer/rollout/loop.py)."""
    return f"{tenant}/{folder_base}" if tenant else folder_base


@dataclass(frozen=True)
class AdapterNames:
    """A run's adapter names: `folder(v)` on disk, `served(v)` in loads, unloads and requests."""

    folder_base: str = ADAPTER_BASE
    tenant: str | None = None

    @property
    def served_base(self) -> str:
        return served_base(self.folder_base, self.tenant)

    def folder(self, version: int) -> str:
        return f"{self.folder_base}-v{int(version)}"

    def served(self, version: int) -> str:
        if self.folder_base == ADAPTER_BASE:  # the fleet's own naming rule, so the proxy and the run agree
            return served_adapter_name(self.tenant, version)
        return f"{self.served_base}-v{int(version)}"

    def version_served(self, name: str) -> int | None:
        """The version a served name stands for, or None for any other name (another run's, the base model)."""
        match = re.fullmatch(rf"{re.escape(self.served_base)}-v(\d+)", name)
        return int(match.group(1)) if match else None
