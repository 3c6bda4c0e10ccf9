"""`make gpu-check` (sia_grpc.bench.gpu_check, docs/gpu-check.md): its dry run on this
CPU machine, for real (controller, two torch agents emulating GPUs, a real job moved),
and the GPU-type decision it reports for an H100, with NVML faked."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sia_grpc.bench.gpu_check import STEPS, make_plan
from sia_grpc.bench.gpu_check_steps import NO_CUDA, step_nvml

ROOT = Path(__file__).resolve().parents[1]
CUDA_STEPS = {"nvml", "oom", "isolation"}


# Processes (a controller's agents, torch workers): the "heavy" group (tests/conftest.py).
@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(240)
def test_dry_run_runs_every_step_and_skips_only_the_cuda_ones(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "sia_grpc.bench.gpu_check", "--dry",
                           "--out", str(out)], capture_output=True, text=True, timeout=220,
                          cwd=ROOT, check=False)
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout == summary and "passed" in summary.splitlines()[0]
    result = json.loads((out / "result.json").read_text())
    assert result["dry"] and result["verdict"] == "passed"
    assert list(result["steps"]) == [name for name, _, _ in STEPS]
    for name, r in result["steps"].items():
        if name in CUDA_STEPS:
            assert (r["status"], r["reason"]) == ("skipped", NO_CUDA), (name, r)
            assert f"{name:10s} SKIPPED: {NO_CUDA}" in summary
        else:
            assert r["status"] == "ok", (name, r)
    steps = result["steps"]
    assert steps["install"]["torch"] and steps["overhead"]["plain_step_ms"] > 0
    assert len(steps["profile"]["samples"]) == len(steps["profile"]["sizes_requested"])
    # (how well the fit predicts is the GPU run's verdict: on a loaded CPU, step times
    # of a few ms are noise, and a held-back error over 100% was seen)
    assert steps["fit"]["held_back"] and math.isfinite(steps["fit"]["max_abs_relative_error"])
    job = steps["job"]
    assert job["final_state"] == "SUCCEEDED" and "PROFILING" in job["states_seen"]
    assert job["moved_to"] != job["first_node"] and job["restarts"] >= 1
    assert (steps["samples"]["lost"], steps["samples"]["repeated"]) == (0, 0)
    assert len(steps["samples"]["generations"]) >= 2


def _fake_pynvml(name: str, mib: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: name
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=mib * 2**20)
    m.nvmlSystemGetDriverVersion = lambda: "999.1"
    return m


def test_an_h100_is_reported_as_a_type_the_controller_profiles(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml("NVIDIA H100 80GB HBM3", 81559))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    ctx: dict = {}
    r = step_nvml(make_plan(True, tmp_path), ctx)
    assert r["status"] == "ok" and ctx["gpu_type"] == r["gpu_type"] == "h100"
    assert r["gpus"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                          "memory_total_mib": 81559}]
    assert not r["profiled_type"] and "profiled on it on arrival" in r["decision"]
    assert "no shipped profile" in r["unknown_type_warning"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_target_runs_the_dry_check_without_the_full_install():
    text = subprocess.run(["make", "-n", "gpu-check", "DRY=1", "OUT=/tmp/x"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert "-m sia_grpc.bench.gpu_check --out \"/tmp/x\" --dry" in text
    assert "apt-get" not in text and "pip install" in text  # (only where imports fail)
