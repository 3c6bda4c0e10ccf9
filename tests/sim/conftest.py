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


TRACE = """name,time,application,num_replicas,batch_size
j0,0,ncf,1,256
j1,30,cifar10,2,256
j2,90,ncf,1,512
"""


@pytest.fixture
def trace(tmp_path):
    """A three-job trace (tiny.csv) of short jobs: a whole simulation in seconds."""
    path = tmp_path / "tiny.csv"
    path.write_text(TRACE)
    return path
