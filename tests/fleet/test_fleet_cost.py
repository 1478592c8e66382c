"""The end-of-run cost lines of a fleet (pure): replica-seconds by size, $ and $ per 1,000 samples with a price, and
the largest fixed fleet for the same wall time; and the policy's replacement of a lost replica Job."""

from __future__ import annotations

import pytest

from agrpo.fleet.cost import FleetBill, fleet_cost_lines
from agrpo.fleet.policy import ADD, HOLD, Knobs, replacement


@pytest.mark.parametrize(
    "bill, expected",
    [
        (  # local, no price: replica-seconds only
            FleetBill({1: 100.0, 2: 50.0}, max_replicas=2),
            [
                "  used         200 replica-seconds (1 replica(s) 100 s, 2 replica(s) 50 s)",
                "  fixed max    2 replica(s) for the same 150 s: 300 replica-seconds; auto used 67% of it",
            ],
        ),
        (  # samples without a price: counted, not priced
            FleetBill({1: 100.0}, max_replicas=4, samples=1600),
            [
                "  used         100 replica-seconds (1 replica(s) 100 s) for 1,600 samples trained",
                "  fixed max    4 replica(s) for the same 100 s: 400 replica-seconds; auto used 25% of it",
            ],
        ),
        (  # a Jobs run: h200 at $5/h, 1 h at 1 replica and 1 h at 3, 10,000 samples
            FleetBill({1: 3600.0, 3: 3600.0}, max_replicas=4, samples=10_000, price_per_hour=5.0, source="table"),
            [
                "  used         14400 replica-seconds (1 replica(s) 3600 s, 3 replica(s) 3600 s) for 10,000 samples "
                "trained: $20.00, $2.00 per 1,000 samples",
                "  fixed max    4 replica(s) for the same 7200 s: 28800 replica-seconds: $40.00, $4.00 per 1,000 "
                "samples; auto used 50% of it",
                "  (priced at $5.00 per replica-hour: table)",
            ],
        ),
        (  # a CPU rehearsal: cents per 1,000 samples keep four decimals
            FleetBill({1: 360.0}, max_replicas=2, samples=1000, price_per_hour=0.03, source="cpu-upgrade"),
            [
                "  used         360 replica-seconds (1 replica(s) 360 s) for 1,000 samples trained: $0.00, $0.0030 per "
                "1,000 samples",
                "  fixed max    2 replica(s) for the same 360 s: 720 replica-seconds: $0.01, $0.0060 per 1,000 samples; "
                "auto used 50% of it",
                "  (priced at $0.03 per replica-hour: cpu-upgrade)",
            ],
        ),
        (  # nothing ran
            FleetBill({}, max_replicas=2, price_per_hour=1.0),
            [
                "  used         0 replica-seconds (none): $0.00",
                "  fixed max    2 replica(s) for the same 0 s: 0 replica-seconds: $0.00",
                "  (priced at $1.00 per replica-hour: the price given)",
            ],
        ),
    ],
)
def test_cost_lines(bill, expected):
    assert fleet_cost_lines(bill) == expected


@pytest.mark.parametrize(
    "serving, replaced, budget, action, fragment",
    [
        (2, 0, 3, None, None),  # at min: the signals decide, no replacement for its own sake
        (3, 0, 3, None, None),  # above min after a loss: same
        (1, 0, 3, ADD, "replace a lost replica: 1 replica(s) serving, below inference.min_replicas=2 (replacement 1"),
        (0, 2, 3, ADD, "(replacement 3 of 3)"),
        (1, 3, 3, HOLD, "3 lost replica(s) were replaced already (inference.fleet.max_replacements=3): going on"),
        (1, 0, 0, HOLD, "max_replacements=0"),  # replacements off
    ],
)
def test_a_lost_replica_is_replaced_only_below_min_and_within_the_budget(serving, replaced, budget, action, fragment):
    decision = replacement(serving, Knobs(min_replicas=2, max_replicas=4), replaced, budget)
    if action is None:
        assert decision is None
    else:
        assert decision.action == action and fragment in decision.reason
