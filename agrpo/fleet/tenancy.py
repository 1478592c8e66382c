"""Names on a shared fleet (issue 43): the contract's module. The implementation lives in agrpo/proxy/tenant_names.py
so that the proxy and the config layer, which agrpo.fleet imports, can use the same names without an import cycle."""

from agrpo.proxy.tenant_names import (
    ADAPTER_BASE,
    FLEET_NAME_RE,
    SLUG_MAX,
    TENANT_RE,
    in_namespace,
    run_slug,
    served_adapter_name,
    tenant_id,
    tenant_of,
    valid_fleet_name,
)

__all__ = [
    "ADAPTER_BASE",
    "FLEET_NAME_RE",
    "SLUG_MAX",
    "TENANT_RE",
    "in_namespace",
    "run_slug",
    "served_adapter_name",
    "tenant_id",
    "tenant_of",
    "valid_fleet_name",
]
