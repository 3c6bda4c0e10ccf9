"""Fixtures shared across test directories."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from otlp_receiver import OtlpTraceReceiver


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpTraceReceiver]:
    with OtlpTraceReceiver() as receiver:
        yield receiver


