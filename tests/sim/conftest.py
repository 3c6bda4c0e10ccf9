"""Fixtures of the simulator's tests."""

from __future__ import annotations

import pytest

# Two queues (a guaranteed 4 rtx), a priority class, and jobs naming no queue put
# 3 : 1 into a and b by the hash rule.
QUEUES_TOML = """
[[queue]]
name = "a"
guarantee = {rtx = 4}

[[queue]]
name = "b"

[[priority_class]]
name = "prod"
weight = 2.0

[assignment]
by = "hash"
shares = {a = 3, b = 1}
"""


@pytest.fixture
def queues_path(tmp_path):
    """A queues file with `QUEUES_TOML`."""
    path = tmp_path / "q.toml"
    path.write_text(QUEUES_TOML)
    return path
