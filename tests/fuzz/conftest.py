"""The fuzz tests' controller fixture and the per-RPC tally printed after the run."""

from __future__ import annotations

import json
import os

import grpc
import pytest
from fuzzkit import SCALE, TALLY, ThreadedController, fuzz_config


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with ThreadedController(fuzz_config(tmp_path_factory.mktemp("fuzz"))) as c:
        yield c


@pytest.fixture(scope="module")
def channel(served):
    with grpc.insecure_channel(served.target) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch


def pytest_terminal_summary(terminalreporter) -> None:
    if not TALLY:
        return
    total = sum(sum(c.values()) for c in TALLY.values())
    terminalreporter.section(f"fuzz cases per RPC (SIA_FUZZ_EXAMPLES={SCALE})")
    for rpc in sorted(TALLY):
        codes = ", ".join(f"{k} {v}" for k, v in TALLY[rpc].most_common())
        terminalreporter.write_line(f"{rpc:45s} {sum(TALLY[rpc].values()):7d}  ({codes})")
    terminalreporter.write_line(f"{'total':45s} {total:7d}")
    path = os.environ.get("SIA_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"scale": SCALE, "total": total,
                       "rpcs": {k: dict(v) for k, v in sorted(TALLY.items())}}, f, indent=1)
