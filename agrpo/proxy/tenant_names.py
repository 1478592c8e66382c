"""Names on a shared fleet (issue 43), pure: the fleet's name, a tenant's id and the served name of its adapters.

A run on a shared fleet serves its adapters as `<tenant>/trl-policy-vN` so that two runs never share a name: vLLM
keys its prefix cache and its LoRA slots by that name, and the proxy's namespace rules (a tenant loads, unloads and
asks for only `<tenant>/...`) rest on it. Without a shared fleet the names stay `trl-policy-vN`. The adapter FOLDER
on disk keeps its plain name; only the served name carries the namespace. docs/shared_fleet.md.

Import these as `agrpo.fleet.tenancy` (the contract's name, a re-export); the proxy and the config layer import
this module directly, because agrpo.fleet imports agrpo.config (an edge back would be an import cycle).
"""

from __future__ import annotations

import re

ADAPTER_BASE = "trl-policy"
FLEET_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
TENANT_RE = re.compile(r"t[0-9]+-[a-z0-9-]{1,24}")
SLUG_MAX = 24


def served_adapter_name(tenant: str | None, version: int) -> str:
    """The name vLLM serves version `version` under: `trl-policy-vN`, or `<tenant>/trl-policy-vN` on a shared fleet."""
    name = f"{ADAPTER_BASE}-v{int(version)}"
    return f"{tenant}/{name}" if tenant else name


def tenant_of(adapter_name: str) -> str | None:
    """The tenant an adapter (or a request's `model`) belongs to, or None for a name outside every namespace (the
    base model, `trl-policy-vN` of a single-run fleet, or a hub id like `org/model` that is no tenant id)."""
    if not isinstance(adapter_name, str):
        return None
    head, sep, rest = adapter_name.partition("/")
    if not sep or not rest or not TENANT_RE.fullmatch(head):
        return None
    return head


def valid_fleet_name(name: object) -> str | None:
    """None when `name` can name a fleet (it becomes a file name and a process label), else the problem in words."""
    if not isinstance(name, str) or not FLEET_NAME_RE.fullmatch(name):
        return (
            f"fleet name {name!r} is not valid: use 1 to 32 characters, lowercase letters, digits and '-', "
            "starting with a letter or digit (e.g. 'default', 'sweep-lr')"
        )
    return None


def run_slug(run: str) -> str:
    """The run name as it appears in a tenant id: lowercase, `[a-z0-9-]` only, at most 24 characters, never empty."""
    slug = re.sub(r"[^a-z0-9-]+", "-", str(run).lower()).strip("-")[:SLUG_MAX].strip("-")
    return slug or "run"


def tenant_id(counter: int, run: str) -> str:
    """The id the fleet gives its `counter`-th tenant: `t<k>-<slug>`."""
    return f"t{int(counter)}-{run_slug(run)}"


def in_namespace(tenant: str, adapter_name: object) -> bool:
    """Whether `adapter_name` lies in `tenant`'s namespace (`<tenant>/...`)."""
    return isinstance(adapter_name, str) and tenant_of(adapter_name) == tenant
