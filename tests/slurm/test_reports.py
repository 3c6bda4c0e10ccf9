"""The bridge's WorkerService over real gRPC, reported to by the training library's
own client (`sia_grpc.train.telemetry.AgentClient`), and the reports in the ticket."""

from __future__ import annotations

import grpc
import pytest

from sia_grpc.api import WorkerServiceStub, pb
from sia_grpc.slurm.bridge import Bridge
from sia_grpc.slurm.reports import ReportServer
from sia_grpc.slurm.translate import Ticket, policy_job
from sia_grpc.train.telemetry import AgentClient

SPEC = {"application": "cifar10", "adaptivity": "adaptive"}


def _report(job_id: str, step: float, count: int) -> pb.WorkerReport:
    return pb.WorkerReport(telemetry=pb.Telemetry(
        job_id=job_id, generation=1, progress=0.1,
        samples=[pb.ThroughputSample(gpu_type="rtx", num_nodes=1, num_replicas=2,
                                     atomic_batch_size=64, accum_steps=0, step_time_s=step,
                                     sync_time_s=0.01, count=count)],
        grad=pb.GradientStats(sqr=2.0, var=3.0)))


@pytest.fixture
def server():
    s = ReportServer("127.0.0.1:0", "s3cret")
    yield s
    s.stop()


def test_workers_report_with_the_token_and_reports_add_up_until_taken(server):
    client = AgentClient(address=f"127.0.0.1:{server.port}", token="s3cret")
    try:
        assert client.report(_report("7", 0.2, 10)).current
        assert client.report(_report("7", 0.4, 30)).current
    finally:
        client.close()
    taken = server.take()
    (sample,) = taken["7"].samples
    assert sample.count == 40 and sample.step_time_s == pytest.approx(0.35)
    assert server.take() == {}  # taken once


def test_the_reply_to_rank_0_of_the_current_copy_carries_the_batch_the_bridge_gave(server):
    client = AgentClient(address=f"127.0.0.1:{server.port}", token="s3cret")
    try:
        assert not client.report(_report("7", 0.2, 1)).atomic_batch_size  # none given
        server.set_batches({"7": (1, (512, 128, 1))})
        reply = client.report(_report("7", 0.2, 1))
        assert (reply.current, reply.batch_size, reply.atomic_batch_size,
                reply.accum_steps) == (True, 512, 128, 1)
        rank1 = pb.WorkerReport(rank=1, telemetry=_report("7", 0.2, 1).telemetry)
        assert not client.report(rank1, force=True).atomic_batch_size  # rank 0 decides
        server.set_batches({"7": (2, (512, 128, 1))})  # a newer copy's (moved since)
        assert not client.report(_report("7", 0.2, 1), force=True).atomic_batch_size
    finally:
        client.close()


def test_a_report_without_the_token_is_refused(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = WorkerServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as err:
                stub.Report(_report("7", 0.2, 1), metadata=metadata, timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert server.received == 0 and server.take() == {}


def test_reports_in_the_ticket_feed_the_policy_and_survive_the_comment():
    t = Ticket("7", SPEC, 0.0)
    t = t.observe(_report("7", 0.2, 10).telemetry).observe(_report("7", 0.4, 30).telemetry)
    assert t.obs == (("rtx", 1, 2, 64, 0, 40, pytest.approx(0.35), pytest.approx(0.01)),)
    assert t.grad == (2.0, 3.0)
    assert t.progress == 0.1
    behind = _report("7", 0.2, 10).telemetry
    behind.progress = 0.05  # (a copy restored from an older checkpoint)
    assert t.observe(behind).progress == 0.1  # the furthest it got stands
    again = Ticket.parse(t.comment(), 7)
    assert again == t
    job = policy_job(again, 10.0)
    assert [(s.num_replicas, s.atomic_batch_size, s.count) for s in job.samples
            if s.num_replicas == 2] == [(2, 64, 40)]
    assert (job.grad.sqr, job.grad.var) == (2.0, 3.0)
    assert (job.progress, job.run_time_s) == (0.1, 0.0)  # it has not run yet, as far as known


def test_a_moves_cost_is_measured_from_the_placement_to_the_copys_first_report():
    # What a move cost a job, end to end (the old copy's checkpoint, Slurm's launch,
    # the restore): from when the bridge gave the copy its shape (`placed`, plan) to
    # the first report of the copy's generation. It becomes the restart cost the
    # policy weighs, in place of the spec's guess, and survives in the comment.
    now = [100.0]
    server = ReportServer("127.0.0.1:0", "s3cret", clock=lambda: now[0])
    bridge = Bridge(None, None, reports=server, clock=lambda: now[0])
    try:
        old = _report("7", 0.2, 10)
        old.telemetry.generation = 0
        server.add(old.telemetry)
        now[0] = 150.0
        server.add(old.telemetry)  # (not the first of its generation)
        assert server.first_report("7", 0) == 100.0
        moved = Ticket("7", SPEC, 0.0, moves=1, placed=170.0)
        assert bridge._measure_restart(moved, 0) == moved  # the old copy's, not this one's
        assert bridge._measure_restart(moved, 1) == moved  # the copy has not reported
        now[0] = 212.5
        server.add(_report("7", 0.2, 10).telemetry)  # generation 1, the copy
        now[0] = 260.0
        server.add(_report("7", 0.2, 10).telemetry)
        assert server.first_report("7", 1) == 212.5 and server.first_report("7", 0) is None
        measured = bridge._measure_restart(moved, 1)
        assert (measured.restart_s, measured.placed) == (42.5, None)
        assert Ticket.parse(measured.comment(), 7) == measured
        assert policy_job(measured, 300.0).restart_cost_s == 42.5
        # The copy has run since its first report: what its progress is made in.
        assert measured.running_since == 212.5
        assert policy_job(measured, 300.0).run_time_s == 87.5
        assert policy_job(moved, 300.0).restart_cost_s == 50.0  # unmeasured: cifar10's
        # A first start stops no old copy: its span is not the job's restart cost
        # but Slurm's share of one (`launch_s`), which prices the jobs not yet moved.
        fresh = _report("8", 0.2, 10)
        fresh.telemetry.generation = 0
        server.add(fresh.telemetry)
        first = bridge._measure_restart(Ticket("8", SPEC, 0.0, placed=90.0), 0)
        assert (first.restart_s, first.launch_s, first.placed) == (None, 170.0, None)
        assert Ticket.parse(first.comment(), 8) == first
    finally:
        server.stop()
