"""Fixtures of the tests against a second local user (tests/hostile_user.py)."""

from __future__ import annotations

import pytest

from tests.hostile_user import SharedDir


@pytest.fixture
def shared():
    """A /tmp-like directory (1777) both users can reach, removed afterwards."""
    shared = SharedDir()
    yield shared.path
    shared.remove()
