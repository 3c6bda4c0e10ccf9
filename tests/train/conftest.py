"""Fixtures for the in-process training-library tests."""

from __future__ import annotations

import sys

import pytest

from sia_grpc.train import runtime


@pytest.fixture
def fresh_runtime():
    """A process with no runtime yet; the one the test set up is forgotten after it
    (its excepthook undone)."""
    hook = sys.excepthook
    runtime.reset()
    yield
    runtime.reset()
    sys.excepthook = hook
