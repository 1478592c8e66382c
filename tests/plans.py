"""Plans as tests read them: bound with example values (pure: no port is reserved and no secret made)."""

from __future__ import annotations

from agrpo.launchers.plan import Plan, bind, port_placeholder, secret_placeholder


def example_values(plan: Plan) -> dict[str, str]:
    """Each port group numbered from its start in the order it names them (a local plan: vllm-0=8100, vllm-1=8101,
    ..., then the proxy), each secret `<name>-value`."""
    values = {
        port_placeholder(name): str(group.start + index)
        for group in plan.placeholders.ports
        for index, name in enumerate(group.names)
    }
    values.update({secret_placeholder(name): f"{name}-value" for name in plan.placeholders.secrets})
    return values


def bound_example(plan: Plan) -> Plan:
    return bind(plan, example_values(plan))
