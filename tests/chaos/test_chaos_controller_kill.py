"""SIGKILL the controller process under load: clients creating jobs concurrently,
modeled agents (a separate process) streaming. Restarted on the same store: every
job whose CreateJob returned OK is there, the agents reconnect, running workers
keep their generation, and no GPU is allocated to two jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from sia_grpc.api import ClusterServiceStub, JobServiceStub, pb
from sia_grpc.testing.ports import free_port

# Heavy and timing-sensitive: the "heavy" xdist group (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("heavy")

ENV = {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
       "SIA_ROUND_DURATION": "3", "SIA_EARLY_ROUND_DELAY": "0.3",
       "SIA_HEARTBEAT_INTERVAL": "0.5", "SIA_HEARTBEAT_TIMEOUT": "20",
       "SIA_INLINE_SOLVER": "true", "SIA_STORE_SYNCHRONOUS": "FULL"}


def _controller(port: int, db) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sia_grpc.controller", "--listen", f"127.0.0.1:{port}",
         "--db", str(db), "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except grpc.RpcError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _no_gpu_twice(jobs: list[pb.Job]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for j in jobs:
        if j.status.state not in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_RESTARTING):
            continue
        for g in j.status.allocation.gpus:
            key = (g.node, g.index)
            assert key not in seen, f"GPU {key} allocated to {seen[key]} and {j.job_id}"
            seen[key] = j.job_id


def _latest_round(cluster) -> int:
    """The number of the last round that ran (0: none yet)."""
    rounds = cluster.ListRounds(pb.ListRoundsRequest(limit=5), timeout=10).rounds
    return max((r.round for r in rounds), default=0)


def _all_jobs(stub) -> list[pb.Job]:
    out, token = [], ""
    while True:
        page = stub.ListJobs(pb.ListJobsRequest(page_size=1000, page_token=token), timeout=10)
        out.extend(page.jobs)
        token = page.next_page_token
        if not token:
            return out


@pytest.mark.timeout(150)
def test_sigkilled_controller_loses_no_accepted_job_and_agents_reconnect(tmp_path):
    # The restarted controller comes back on the same port (the clients keep their
    # target), so the port is named before the first one binds it.
    port, db = free_port(), tmp_path / "sia.db"
    target = f"127.0.0.1:{port}"
    ctrl = _controller(port, db)
    agents = subprocess.Popen(
        [sys.executable, "-m", "sia_grpc.nodeagent", "--controller", target, "--node-id", "rtx",
         "--gpus", "rtx:4", "--count", "2", "--time-scale", "20", "--telemetry-interval", "0.2",
         "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    accepted: list[str] = []
    refused: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(k: int) -> None:
        with grpc.insecure_channel(target) as ch:
            stub = JobServiceStub(ch)
            n = 0
            while not stop.is_set():
                n += 1
                job_id = f"c{k}-{n}"
                try:
                    stub.CreateJob(pb.CreateJobRequest(job_id=job_id, spec=pb.JobSpec(
                        name="cifar10", application="cifar10",
                        adaptivity=pb.ADAPTIVITY_ADAPTIVE, max_gpus=2)), timeout=5)
                except grpc.RpcError as err:
                    with lock:
                        refused.append(f"{job_id}: {err.code().name}")
                    time.sleep(0.05)
                    continue
                with lock:
                    accepted.append(job_id)
                time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    try:
        with grpc.insecure_channel(target) as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
            jobs, cluster = JobServiceStub(ch), ClusterServiceStub(ch)
            _wait(lambda: len(cluster.GetCluster(pb.GetClusterRequest()).nodes) == 2, 60,
                  "two agents")
            for t in threads:
                t.start()
            # Under load, with workers running: then SIGKILL, mid-stream.
            _wait(lambda: any(j.status.state == pb.JOB_STATE_RUNNING
                              for j in _all_jobs(jobs)), 60, "a running job")
            _wait(lambda: len(accepted) >= 10, 60, "ten accepted creates")
            before = {j.job_id: j for j in _all_jobs(jobs)}
            ctrl.send_signal(signal.SIGKILL)
            ctrl.wait(timeout=10)
        with lock:
            ok_before_kill = list(accepted)
            refused_before = len(refused)
        # Clients keep trying against the dead port.
        _wait(lambda: len(refused) > refused_before, 30, "a create refused while down")
        ctrl = _controller(port, db)
        with grpc.insecure_channel(target) as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
            jobs, cluster = JobServiceStub(ch), ClusterServiceStub(ch)
            _wait(lambda: len(accepted) >= len(ok_before_kill) + 10, 60,
                  "ten creates accepted by the restarted controller")
            stop.set()
            for t in threads:
                t.join(10)
            after = {j.job_id: j for j in _all_jobs(jobs)}
            missing = [j for j in accepted if j not in after]
            assert not missing, f"accepted but lost: {missing[:10]} ({len(missing)})"
            assert len(ok_before_kill) >= 10 and len(accepted) > len(ok_before_kill)
            _wait(lambda: sorted((n.name, n.state) for n in cluster.GetCluster(
                pb.GetClusterRequest()).nodes) == [("rtx-0", pb.NODE_STATE_READY),
                                                   ("rtx-1", pb.NODE_STATE_READY)],
                  30, "the agents to reconnect")
            # Two rounds on the restored state: still no GPU twice, books within capacity.
            last, deadline = _latest_round(cluster), time.monotonic() + 60
            while True:
                current = _all_jobs(jobs)
                _no_gpu_twice(current)
                for t in cluster.GetCluster(pb.GetClusterRequest()).types:
                    assert t.allocated <= t.gpus
                if _latest_round(cluster) >= last + 2:
                    break
                assert time.monotonic() < deadline, "timed out waiting for two rounds"
                time.sleep(0.1)
            running = [i for i, j in before.items() if j.status.state == pb.JOB_STATE_RUNNING]
            kept = [i for i in running
                    if jobs.GetJob(pb.GetJobRequest(job_id=i)).status.generation
                    == before[i].status.generation]
            assert kept, "every running worker was restarted after the controller came back"
        print(f"\naccepted {len(accepted)} ({len(ok_before_kill)} before the kill), "
              f"refused while down {len(refused)}, running at the kill {len(running)}, "
              f"kept their generation {len(kept)}")
    finally:
        stop.set()
        for p in (agents, ctrl):
            if p.poll() is None:
                p.kill()
                p.wait(10)
