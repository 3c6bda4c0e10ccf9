"""Plots of small hand-built runs: each writes a real PNG, also with nothing finished."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sia_grpc.sim import plots
from sia_grpc.sim.records import JobRecord, RoundRecord, SimResult

PNG = b"\x89PNG\r\n\x1a\n"
H = 3600.0


def is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 100 and data[:8] == PNG


def result(policy="sia", workload="helios-1", *, finished=True) -> SimResult:
    jobs = tuple(
        JobRecord(name=f"j{i}", application="bert", category="adaptive",
                  submit_time=i * 600.0, start_time=i * 600.0 + 60.0,
                  finish_time=(i * 600.0 + (i + 1) * 1800.0) if finished else None,
                  gpu_seconds=(i + 1) * 7200.0, restarts=i % 2,
                  isolated_jct=(i + 1) * 1500.0 if i % 3 else None)
        for i in range(6))
    rounds = tuple(
        RoundRecord(time=k * 60.0, policy_seconds=0.01, active_jobs=min(6, k + 1),
                    gpus_in_use={"a100": min(8, 2 * k), "t4": min(16, k)})
        for k in range(60))
    return SimResult(workload=workload, policy=policy, cluster="het-24",
                     capacity={"a100": 8, "t4": 16}, jobs=jobs, rounds=rounds)


def by_policy():
    return {"sia": [result("sia", "w1"), result("sia", "w2")],
            "gavel": [result("gavel", "w1", finished=False)]}


def test_jct_cdf(tmp_path):
    path = plots.jct_cdf(by_policy(), tmp_path / "jct.png")
    assert path == tmp_path / "jct.png" and is_png(path)


def test_ftf_cdf(tmp_path):
    assert is_png(plots.ftf_cdf(by_policy(), tmp_path / "ftf.png"))


def test_allocation_over_time(tmp_path):
    assert is_png(plots.allocation_over_time(result(), tmp_path / "sub" / "alloc.png"))


def test_no_finished_jobs_and_no_rounds(tmp_path):
    unfinished = {"gavel": [result("gavel", finished=False)]}
    assert is_png(plots.jct_cdf(unfinished, tmp_path / "jct.png"))
    assert is_png(plots.ftf_cdf(unfinished, tmp_path / "ftf.png"))
    empty = SimResult(workload="w", policy="p", cluster="c", capacity={"a100": 4},
                      jobs=(), rounds=())
    assert is_png(plots.allocation_over_time(empty, tmp_path / "alloc.png"))
    assert is_png(plots.jct_cdf({}, tmp_path / "jct_empty.png"))
    one_round = SimResult(workload="w", policy="p", cluster="c", capacity={},
                          jobs=(), rounds=(RoundRecord(0.0, 0.0, 0, {"v100": 2}),))
    assert is_png(plots.allocation_over_time(one_round, tmp_path / "alloc1.png"))


def test_write_all_names_and_sanitises(tmp_path):
    runs = {"sia/p=-0.5": [result("sia/p=-0.5", "helios trace #1")],
            "sia p=-0.5": [result("sia p=-0.5", "helios trace #1")],
            "pollux": [],
            "gavel": [result("gavel", "w1", finished=False), result("gavel", "w2")]}
    paths = plots.write_all(runs, tmp_path / "out")
    names = [p.name for p in paths]
    assert names == ["jct_cdf.png", "ftf_cdf.png",
                     "allocation_sia_p_-0.5_helios_trace_1.png",
                     "allocation_sia_p_-0.5_helios_trace_1_2.png",
                     "allocation_gavel_w1.png"]
    assert all(p.parent == tmp_path / "out" and is_png(p) for p in paths)


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"sia-grpc\[plots\]"):
        plots.jct_cdf({}, tmp_path / "x.png")


def test_importing_sim_needs_no_matplotlib():
    code = ("import sys, sia_grpc.sim, sia_grpc.sim.metrics, sia_grpc.sim.plots;"
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
