"""The fuzz tests' controller fixture. Their tally of cases per RPC (fuzzkit) is
printed after the run by tests/conftest.py, summed over xdist workers."""

from __future__ import annotations

import grpc
import pytest
from fuzzkit import ThreadedController, fuzz_config


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with ThreadedController(fuzz_config(tmp_path_factory.mktemp("fuzz"))) as c:
        yield c


@pytest.fixture(scope="module")
def channel(served):
    with grpc.insecure_channel(served.target) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch
