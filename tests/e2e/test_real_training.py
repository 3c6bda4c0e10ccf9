"""The whole stack with real training: a controller, two agents with the torch
back-end emulating GPUs of two types (subprocesses), real PyTorch jobs from
sia_grpc.train.examples profiled, placed and run to their target (`sia demo`
with two small jobs)."""

from __future__ import annotations

import io

import pytest

from sia_grpc.demo.training import DemoJob, train_demo

# Heavy and timing-sensitive: the "heavy" xdist group (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("heavy")


@pytest.mark.timeout(240)
async def test_demo_trains_real_jobs_on_emulated_gpus_to_completion(tmp_path):
    jobs = (DemoJob(0, "mlp-t", "mlp", 3, 64, 1024, ("--samples", "4096")),
            DemoJob(2, "cnn-t", "cnn", 2, 32, 512, ("--samples", "2048")))
    out = io.StringIO()
    # 6 s rounds (the demo has 10): a worker that starts slowly on a busy machine (the
    # suite runs in parallel) still trains an epoch before the next round can move it.
    rc = await train_demo(jobs=jobs, round_s=6.0, refresh_s=0.5, limit_s=200.0, out=out,
                          keep=str(tmp_path))
    text = out.getvalue()
    summary = text[text.index("Summary"):]
    assert rc == 0, summary
    for name in ("mlp-t", "cnn-t"):
        (line,) = [ln for ln in summary.splitlines() if ln.startswith(name)]
        assert "SUCCEEDED" in line and ("dgx-ext" in line or "rtx" in line), line
    # Real workers trained: each job's per-generation logs show the examples' epochs (a
    # generation moved before its first epoch on a loaded machine legitimately has none).
    for name in ("mlp-t", "cnn-t"):
        logs = list(tmp_path.glob(f"*/jobs/{name}-*/gen-*/rank-0.log"))
        assert any("epoch 0: loss" in p.read_text() for p in logs), (name, logs)
    assert "EMULATE" in text
