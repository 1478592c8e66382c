"""The trainer Job's fleet record (fleet.json, written by the launcher): a bad one refuses with one paragraph naming
the file; the Job never launches replicas from a guessed template."""

from __future__ import annotations

import json

import pytest

from agrpo.errors import LaunchError
from agrpo.launchers.hf_jobs.fleet import JobsFleet


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1]", "it is not a fleet record"),
        ('{"min_replicas": 1, "replica": {"nam', "not JSON"),
        ('{"min_replicas": NaN, "replica": {}}', "NaN is not a finite number"),
        ('{"min_replicas": 1, "replica": {"no_such_field": 1}}', "its fields do not match this agrpo"),
    ],
)
def test_a_bad_fleet_record_is_refused_naming_the_file(text, reason):
    with pytest.raises(LaunchError) as refused:
        JobsFleet.from_json(text, source="/bucket/run/fleet.json")
    message = str(refused.value)
    assert message.startswith(f"/bucket/run/fleet.json cannot be read: {reason}")
    assert "template the launcher uploaded" in message and "\n" not in message
    json.dumps(message)  # one plain paragraph
