"""`sia bench slurm`: the trace replay through the bridge beside Slurm alone, at a
tiny size, and its modeled worker's checkpoint on SIGTERM (no Slurm needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sia_grpc.bench.slurm_truth import TruthServer
from sia_grpc.emulation import load_app
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.testing import slurm as testing_slurm


@pytest.fixture
def worker():
    """The worker's command line, with the bench's truth service behind it."""
    truth = TruthServer()
    yield [sys.executable, "-m", "sia_grpc.bench.slurm_worker", "cifar10", "--truth",
           truth.address]
    truth.stop()


def _worker_env(tmp_path) -> dict[str, str]:
    # What `sia-slurm env` exports for a job the bridge placed on one rtx GPU.
    return {**os.environ, "SIA_JOB_ID": "7", "SIA_GENERATION": "0", "SIA_GPU_TYPE": "rtx",
            "SIA_NUM_GPUS": "1", "SIA_NUM_NODES": "1", "SIA_ATOMIC_BATCH_SIZE": "128",
            "SIA_CHECKPOINT_DIR": str(tmp_path)}


@pytest.mark.timeout(60)
def test_the_modeled_worker_checkpoints_on_sigterm_and_resumes_from_it(tmp_path, worker):
    env = _worker_env(tmp_path)
    # 100x: hours of modeled training, so it is mid-way when signalled.
    first = subprocess.Popen([*worker, "--time-scale", "100"], env=env, text=True,
                             stdout=subprocess.PIPE)
    assert first.stdout.readline().startswith("cifar10: rtx x1")  # it runs
    time.sleep(load_app("cifar10").restart_delay / 100 + 0.5)  # past its modeled restore
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 143 and out.startswith("stopped at progress")
    saved = json.loads((tmp_path / "progress.json").read_text())["progress"]
    assert 0 < saved < load_app("cifar10").max_progress

    again = subprocess.run([*worker, "--time-scale", "1e7"], env=env, text=True,
                           capture_output=True, timeout=30)
    assert again.returncode == 0, again.stderr
    assert f"from progress {saved:.1f}/" in again.stdout  # resumed, not restarted
    assert json.loads((tmp_path / "progress.json").read_text())["progress"] == \
        load_app("cifar10").max_progress


@pytest.mark.timeout(60)
def test_a_modeled_worker_stopped_during_its_restore_keeps_its_checkpoint(tmp_path, worker):
    # Modeled time starts when the worker is ready, with the restore delay: a move
    # that comes sooner (here at 1x, 50 modeled s of restore) neither loses progress
    # nor gains any, however long this machine took to import it.
    env = _worker_env(tmp_path)
    (tmp_path / "progress.json").write_text(json.dumps({"progress": 123.0}))
    first = subprocess.Popen([*worker, "--time-scale", "1"], env=env, text=True,
                             stdout=subprocess.PIPE)
    assert "from progress 123.0/" in first.stdout.readline()
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=30)
    assert first.returncode == 143 and out.startswith("stopped at progress 123.0")
    assert json.loads((tmp_path / "progress.json").read_text())["progress"] == 123.0


@pytest.mark.timeout(60)
def test_the_modeled_worker_reports_to_the_bridge_and_imports_only_the_standard_library(
        tmp_path, worker):
    # Its modeled work comes from the bench's process, so its own start and end take a
    # fraction of a second (at 360x, each second it held its GPUs would be 6 minutes).
    reports = ReportServer("127.0.0.1:0", "tok")
    try:
        env = {**_worker_env(tmp_path), "SIA_AGENT_ADDRESS": f"127.0.0.1:{reports.port}",
               "SIA_AGENT_TOKEN": "tok", "SIA_GENERATION": "2"}
        probe = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                 "runpy.run_module('sia_grpc.bench.slurm_worker', run_name='__main__', "
                 "alter_sys=True)")
        code = ("import atexit, sys\n"
                "atexit.register(lambda: print('HEAVY', sorted({m.split('.')[0] for m in "
                "sys.modules} & {'numpy', 'scipy', 'grpc', 'google', 'structlog'})))\n"
                + probe)
        done = subprocess.run([sys.executable, "-c", code, *worker[2:], "--time-scale", "1e5"],
                              env=env, text=True, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert "finished at progress" in done.stdout and "HEAVY []" in done.stdout
        (t,) = reports.take().values()
        assert (t.job_id, t.generation) == ("7", 2) and t.grad.var > 0
        (sample,) = t.samples
        assert (sample.gpu_type, sample.num_replicas, sample.atomic_batch_size) == ("rtx", 1, 128)
    finally:
        reports.stop()


@pytest.mark.xdist_group("heavy")
@pytest.mark.timeout(120)
def test_a_tiny_replay_finishes_every_job_through_the_bridge_and_under_slurm_alone(capsys):
    reason = testing_slurm.unavailable()
    if reason is not None:
        pytest.skip(f"Slurm: {reason}")
    from sia_grpc.bench.slurm import compare

    report = compare("saturn/workload-1", 3, 3000.0, interval_s=0.5, timeout_s=60.0)
    names = {"cifar10-0", "cifar10-1", "cifar10-2"}
    progress = capsys.readouterr().err  # (not a terminal: each arm's end, on stderr)
    for arm in ("sia", "slurm"):
        assert f"  {arm}: 3/3 jobs ended" in progress
        r = report[arm]
        assert r["states"] == dict.fromkeys(names, "COMPLETED"), arm
        assert set(r["jct_h"]) == names and all(v > 0 for v in r["jct_h"].values())
        assert r["makespan_h"] >= max(r["jct_h"].values()) > 0
        assert 0 <= r["no_progress_gpu_h"] <= r["gpu_h"] and r["gpu_h"] > 0, arm
    # Where the bridge's starts went, and the simulator given what they cost.
    starts = report["sia"]["start_stages_s"]
    assert starts["slurm_side"]["n"] >= 1 and starts["slurm_side"]["p50"] > 0
    sim = report["simulator"]
    assert sim["finished"] == 3 and sim["move_cost_s"] > 0
    lo, hi = sim["avg_jct_h_range"]
    assert lo <= sim["avg_jct_h"] <= hi and sim["phases"] > 1
    # Nothing the bridge asked of Slurm was refused (a refusal is only a warning in
    # its log, which the bench does not print: the count and --json say).
    assert report["sia"]["failed_actions"] == 0, report["sia"].get("failed")
    # What the bridge did and why, for the moves the simulator's Sia does not make.
    assert {d["kind"] for d in report["sia"]["decisions"]} >= {"start"}
    assert {d["job"] for d in report["sia"]["decisions"]} <= names


def test_a_job_has_ended_when_a_copy_completed_even_if_a_cancelled_one_came_after():
    from sia_grpc.bench.slurm import _ended

    def copies(*states: str) -> list[dict]:
        return [{"job_state": s} for s in states]

    assert _ended({"done": copies("CANCELLED", "COMPLETED"),
                   # it completed while being moved: its copy was cancelled (end_move)
                   "done-mid-move": copies("COMPLETED", "CANCELLED"),
                   "moving": copies("CANCELLED"),  # its copy not seen yet
                   "running": copies("CANCELLED", "RUNNING"),
                   "failed": copies("FAILED")}) == 3
