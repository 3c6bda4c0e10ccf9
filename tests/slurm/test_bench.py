"""`sia bench slurm`: the trace replay through the bridge beside Slurm alone, at a
tiny size, and its modeled worker's checkpoint on SIGTERM (no Slurm needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from sia_grpc.emulation import load_app
from sia_grpc.testing import slurm as testing_slurm

WORKER = [sys.executable, "-m", "sia_grpc.bench.slurm_worker", "cifar10"]


def _worker_env(tmp_path) -> dict[str, str]:
    # What `sia-slurm env` exports for a job the bridge placed on one rtx GPU.
    return {**os.environ, "SIA_JOB_ID": "7", "SIA_GENERATION": "0", "SIA_GPU_TYPE": "rtx",
            "SIA_NUM_GPUS": "1", "SIA_NUM_NODES": "1", "SIA_ATOMIC_BATCH_SIZE": "128",
            "SIA_CHECKPOINT_DIR": str(tmp_path)}


@pytest.mark.timeout(60)
def test_the_modeled_worker_checkpoints_on_sigterm_and_resumes_from_it(tmp_path):
    env = _worker_env(tmp_path)
    # 100x: hours of modeled training, so it is mid-way when signalled.
    first = subprocess.Popen([*WORKER, "--time-scale", "100"], env=env, text=True,
                             stdout=subprocess.PIPE)
    assert first.stdout.readline().startswith("cifar10: rtx x1")  # it runs
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 143 and out.startswith("stopped at progress")
    saved = json.loads((tmp_path / "progress.json").read_text())["progress"]
    assert 0 < saved < load_app("cifar10").max_progress

    again = subprocess.run([*WORKER, "--time-scale", "1e7"], env=env, text=True,
                           capture_output=True, timeout=30)
    assert again.returncode == 0, again.stderr
    assert f"from progress {saved:.1f}/" in again.stdout  # resumed, not restarted
    assert json.loads((tmp_path / "progress.json").read_text())["progress"] == \
        load_app("cifar10").max_progress


@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(120)
def test_a_tiny_replay_finishes_every_job_through_the_bridge_and_under_slurm_alone():
    reason = testing_slurm.unavailable()
    if reason is not None:
        pytest.skip(f"Slurm: {reason}")
    from sia_grpc.bench.slurm import compare

    report = compare("saturn/workload-1", 3, 3000.0, interval_s=0.5, timeout_s=60.0)
    names = {"cifar10-0", "cifar10-1", "cifar10-2"}
    for arm in ("sia", "slurm"):
        r = report[arm]
        assert r["states"] == dict.fromkeys(names, "COMPLETED"), arm
        assert set(r["jct_h"]) == names and all(v > 0 for v in r["jct_h"].values())
        assert r["makespan_h"] >= max(r["jct_h"].values()) > 0
