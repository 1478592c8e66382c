"""Names on a shared fleet (issue 43): the contract's module. The implementation lives in agrpo/proxy/tenant_names.py
so that the proxy and the config layer, which agrpo.fleet imports, can use the same names without an import cycle.
Also the one HTTP call both the attaching launcher and the trainer make to the fleet's tenant API."""

import json
import urllib.error
import urllib.request

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
    "tenant_api_call",
]


def tenant_api_call(url: str, method: str, token: str, body: dict | None = None, timeout_s: float = 30.0) -> tuple:
    """(HTTP status, raw answer) of one call to the fleet's tenant API (`url`: the fleet's loopback proxy URL and the
    path). OSError when it cannot be reached."""
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
