"""`sia bench failover` end to end, small: one SIGKILL of the leader of a pair on
PostgreSQL, through the CLI, and its JSON has every figure the benchmark reports.
(The numbers are measured in docs/benchmarks.md, not asserted here.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.xdist_group("heavy"), pytest.mark.timeout(120)]


def test_one_kill_reports_every_figure_and_loses_nothing(postgres_dsn, tmp_path):
    out = tmp_path / "failover.json"
    proc = subprocess.run(
        [sys.executable, "-m", "sia_grpc.cli", "bench", "failover", "--kills", "1",
         "--agents", "4", "--rate", "10", "--store", postgres_dsn, "--json", str(out)],
        capture_output=True, text=True, timeout=110)
    assert out.exists(), proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    assert r["kills"] == 1 and len(r["per_kill"]) == 1
    for key in ("failover_s", "failover_round_s"):
        assert set(r[key]) == {"p50", "p95", "max"} and r[key]["max"] > 0
    assert r["jobs_accepted"] > 0 and r["jobs_lost"] == 0
    assert r["double_allocations"] == 0 and r["terms_in_order"]
    assert r["both_serving_samples"] == 0
    assert "kill → first CreateJob OK" in proc.stdout
