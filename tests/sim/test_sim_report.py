"""`sia report`'s table of the queues' targets (`report.queue_targets`): per workload,
Sia with queues against sia-partitioned and quota-free Sia."""

from __future__ import annotations

import json

from sia_grpc.cli import main
from sia_grpc.sim.report import queue_targets


def run(workload: str, policy: str, avg: float, p99: float,
        violations: tuple[float | None, ...] | None = None) -> dict:
    """A run's JSON as far as the table reads it; `violations`: one queue each (a
    run with queues), None: a run without queues."""
    metrics: dict = {"avg_jct_h": avg, "p99_jct_h": p99}
    if violations is not None:
        metrics["queues"] = {f"q{i}": {"jobs": 1, "guarantee_violation_gpu_h": v,
                                       "violation_waiting_gpu_h": None if v is None else v / 3}
                             for i, v in enumerate(violations)}
    return {"workload": workload, "policy": policy, "metrics": metrics, "cpu_seconds": 1.0}


def row(lines: list[str], workload: str) -> list[str]:
    (line,) = [li for li in lines if li.startswith(f"| {workload} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_target_is_judged_per_workload():
    runs = [run("w/1", "sia", 0.8, 5.0, (0.0, 0.0)),
            run("w/1", "sia-partitioned", 1.0, 5.0, (0.0, 0.0)),
            run("w/2", "sia", 0.7, 6.0, (0.0, 1.5)),
            run("w/2", "sia-partitioned", 1.0, 5.0, (0.0, 0.0))]
    free = [run("w/1", "sia", 0.75, 4.0), run("w/2", "sia", 0.7, 4.0),
            run("w/1", "sia", 9.0, 9.0, (0.0,))]  # a run with queues: not quota-free
    lines = queue_targets(runs, free)
    # ratio 0.80 holds (≤ 0.8; quota-free's own is 0.75), p99 equal is "no worse",
    # +7 % within +10 %.
    assert row(lines, "w/1") == ["w/1", "0.80", "1.00", "0.80", "yes", "0.75", "5.00", "5.00",
                                 "yes", "0.75", "+7 %", "yes", "0.00", "0.00"]
    # p99 6 > 5: worse; the largest violation of its queues.
    assert row(lines, "w/2") == ["w/2", "0.70", "1.00", "0.70", "yes", "0.70", "6.00", "5.00",
                                 "**no**", "0.70", "+0 %", "yes", "1.50", "0.50"]


def test_missing_runs_leave_cells_undefined():
    lines = queue_targets([run("w/1", "sia", 0.9, 5.0, (None,))])
    assert row(lines, "w/1") == ["w/1", "0.90", "—", "—", "—", "—", "5.00", "—", "—", "—", "—",
                                 "—", "—", "—"]
    assert queue_targets([run("w/1", "sia", 0.9, 5.0)]) == []  # no run with queues


def test_report_quota_free_adds_the_targets_table(tmp_path):
    queued, free, out = tmp_path / "q.json", tmp_path / "f.json", tmp_path / "r.md"
    queued.write_text(json.dumps([run("saturn/workload-1", "sia", 0.9, 5.0, (0.0,)),
                                  run("saturn/workload-1", "sia-partitioned", 1.0, 5.0, (0.0,))]))
    free.write_text(json.dumps([run("saturn/workload-1", "sia", 0.8, 5.0)]))
    assert main(["report", str(queued), "--quota-free", str(free), "--out", str(out)]) == 0
    text = out.read_text()
    assert "### Queues against the targets" in text
    assert "| saturn/workload-1 | 0.90 | 1.00 | 0.90 | **no** | 0.80 |" in text
    assert "+12 % | **no** | 0.00 | 0.00 |" in text
