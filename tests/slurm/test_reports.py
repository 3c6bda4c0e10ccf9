"""The bridge's WorkerService over real gRPC, reported to by the training library's
own client (`sia_grpc.train.telemetry.AgentClient`), and the reports in the ticket."""

from __future__ import annotations

import grpc
import pytest

from sia_grpc.api import WorkerServiceStub, pb
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
    again = Ticket.parse(t.comment(), 7)
    assert again == t
    job = policy_job(again, 10.0)
    assert [(s.num_replicas, s.atomic_batch_size, s.count) for s in job.samples
            if s.num_replicas == 2] == [(2, 64, 40)]
    assert (job.grad.sqr, job.grad.var) == (2.0, 3.0)
