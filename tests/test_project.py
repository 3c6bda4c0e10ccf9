"""Project-level promises: the core imports without torch, never reads the
shared folder at run time, and the command line works as documented."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from sia_grpc.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_core_imports_without_torch():
    code = ("import sys, sia_grpc.models, sia_grpc.policy, sia_grpc.controller, sia_grpc.sim;"
            "import sia_grpc.models.profiles, sia_grpc.policy.solvers, sia_grpc.bench.policy;"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'));"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_never_reads_the_shared_folder():
    offenders = [p for p in (ROOT / "sia_grpc").rglob("*.py")
                 if "shared/data" in p.read_text() or "../shared" in p.read_text()]
    assert offenders == []


def test_offline_demo_prints_allocation_tables(capsys):
    assert main(["demo", "--offline", "--jobs", "6", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "Round 2" in out and "GPUs in use" in out
    assert "aws: " in out and "/24" in out and "/16" in out


def test_bench_policy_compares_with_reference(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert main(["bench", "policy", "--scales", "1", "--rounds", "2", "--warmup", "1",
                 "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    (r,) = data["results"]
    assert r["gpus"] == 64 and r["jobs"] == 40
    assert r["ratio"] is not None and r["ratio"] > 0
    assert r["max_rel_diff"] <= 1e-4  # same optimum as the paper's GLPK_MI path
    assert "| 64 |" in capsys.readouterr().out


def test_bench_policy_times_the_call_with_queues_beside_the_same_rounds_without(tmp_path,
                                                                               capsys):
    out_json = tmp_path / "bench.json"
    assert main(["bench", "policy", "--scales", "1", "--rounds", "1", "--warmup", "0",
                 "--no-reference", "--queues", "4", "--json", str(out_json)]) == 0
    q = json.loads(out_json.read_text())["queues"]
    assert q["num_queues"] == 4 and q["gpus"] == 2048 and q["jobs"] == 2000
    assert q["queues"]["p95"] > 0 and q["ratio_p95"] > 0
    assert q["restart_budget"] == 100  # (5 % of the jobs)
    # and the same queues without the budget, beside
    free = json.loads(out_json.read_text())["queues_no_budget"]
    assert free["restart_budget"] is None and free["ratio_p95"] > 0
    out = capsys.readouterr().out
    assert "4 queues (at most 100 restarts a round)" in out
    assert "4 queues (no restart budget)" in out
