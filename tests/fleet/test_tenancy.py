"""Names on a shared fleet: served adapter names, tenant ids and fleet names (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agrpo.fleet.tenancy import (
    ADAPTER_BASE,
    TENANT_RE,
    in_namespace,
    run_slug,
    served_adapter_name,
    tenant_id,
    tenant_of,
    valid_fleet_name,
)


def test_served_names_without_and_with_a_tenant():
    assert ADAPTER_BASE == "trl-policy"
    assert served_adapter_name(None, 3) == "trl-policy-v3"
    assert served_adapter_name("", 3) == "trl-policy-v3"
    assert served_adapter_name("t1-gsm8k", 12) == "t1-gsm8k/trl-policy-v12"


@pytest.mark.parametrize(
    "name, tenant",
    [
        ("t1-gsm8k/trl-policy-v2", "t1-gsm8k"),
        ("t12-a-b/anything", "t12-a-b"),
        ("trl-policy-v2", None),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", None),
        ("/models/smollm2", None),
        ("t1-x/", None),
        ("t-x/trl-policy-v1", None),
        ("T1-X/trl-policy-v1", None),
        ("", None),
    ],
)
def test_tenant_of(name, tenant):
    assert tenant_of(name) == tenant


def test_tenant_of_non_string_is_none():
    assert tenant_of(None) is None  # type: ignore[arg-type]
    assert tenant_of(3) is None  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=10**6), st.text(max_size=60), st.integers(min_value=0, max_value=10**6))
def test_a_tenant_owns_exactly_its_served_names(k, run, version):
    tenant = tenant_id(k, run)
    assert TENANT_RE.fullmatch(tenant)
    name = served_adapter_name(tenant, version)
    assert tenant_of(name) == tenant
    assert in_namespace(tenant, name)
    assert not in_namespace(tenant_id(k + 1, run), name)


def test_slug():
    assert run_slug("GSM8K lr=1e-4") == "gsm8k-lr-1e-4"
    assert run_slug("!!!") == "run"
    assert len(run_slug("x" * 100)) == 24
    assert tenant_id(3, "My Run") == "t3-my-run"


@pytest.mark.parametrize("name", ["default", "sweep", "a", "0-x", "a" * 32])
def test_valid_fleet_names(name):
    assert valid_fleet_name(name) is None


@pytest.mark.parametrize("name", ["", "-x", "Sweep", "a" * 33, "a/b", "a b", "../x", None, 3])
def test_invalid_fleet_names_say_what_is_allowed(name):
    problem = valid_fleet_name(name)
    assert problem and "1 to 32 characters" in problem
