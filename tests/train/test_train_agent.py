"""Workers talking to a fake agent (a real gRPC WorkerService on a Unix socket):
in-place batch changes, stale generations, profiling passes, OOM reports."""

from __future__ import annotations

import pytest
from train_support import FakeAgent, Workers, epoch_indices, read_log

from sia_grpc.api import pb
from sia_grpc.train.contract import EXIT_COMPLETED, EXIT_PROFILED, EXIT_STALE

N = 240


@pytest.mark.timeout(90)
def test_in_place_batch_change_switches_all_ranks_at_the_same_step(tmp_path):
    def reply(report: pb.WorkerReport) -> pb.WorkerReply:
        if len(agent.reports) < 3:
            return pb.WorkerReply(current=True)
        return pb.WorkerReply(current=True, batch_size=24, atomic_batch_size=6, accum_steps=1)

    with FakeAgent(reply) as agent:
        w = Workers(tmp_path, 1, 2, SIA_AGENT_SOCKET=agent.path, SIA_BATCH_SIZE=8,
                    SIA_ATOMIC_BATCH_SIZE=4, SIA_ACCUM_STEPS=0, SIA_REPORT_INTERVAL_S=0.05,
                    SIA_TARGET_EPOCHS=2, TEST_N=N, TEST_B0=8, TEST_STEP_SLEEP=0.01)
        assert w.wait() == [EXIT_COMPLETED] * 2, w.output()
        reports = list(agent.reports)

    per_rank = {}
    for rank in (0, 1):
        steps = {}
        for r in read_log(tmp_path, 1, rank):
            steps.setdefault(r["step"], set()).add(tuple(r["shape"]))
        per_rank[rank] = steps
        shapes = [s for _, s in sorted(steps.items())]
        assert all(len(s) == 1 for s in shapes)
        switch = next(i for i, s in enumerate(shapes) if s == {(6, 1)})
        assert set().union(*shapes[:switch]) == {(4, 0)}
        assert set().union(*shapes[switch:]) == {(6, 1)}
    assert per_rank[0] == per_rank[1]  # same step, same shape, on both ranks
    for idx in epoch_indices(read_log(tmp_path, 1)).values():
        assert sorted(idx) == list(range(N))

    assert all(r.rank == 0 and r.telemetry.job_id == "job-1" for r in reports)
    assert all(r.telemetry.generation == 1 for r in reports)
    samples = {(s.num_replicas, s.atomic_batch_size, s.accum_steps) for r in reports
               for s in r.telemetry.samples}
    assert {(2, 4, 0), (2, 6, 1)} <= samples
    for r in reports:
        for s in r.telemetry.samples:
            assert s.gpu_type == "cpu-test" and s.num_nodes == 1 and s.count >= 1
            assert 0 <= s.sync_time_s < s.step_time_s
    assert any(r.telemetry.grad.sqr > 0 and r.telemetry.grad.var > 0 for r in reports)
    assert all(r.startup_s > 0 for r in reports)
    progress = [r.telemetry.progress for r in reports]
    assert progress == sorted(progress) and progress[-1] == pytest.approx(1.0)


@pytest.mark.timeout(60)
def test_stale_reply_exits_without_checkpointing(tmp_path):
    with FakeAgent(lambda r: pb.WorkerReply(current=False)) as agent:
        w = Workers(tmp_path, 4, 2, SIA_AGENT_SOCKET=agent.path, SIA_ATOMIC_BATCH_SIZE=4,
                    SIA_REPORT_INTERVAL_S=0.05, SIA_CHECKPOINT_INTERVAL_S=0, TEST_N=N)
        assert w.wait() == [EXIT_STALE] * 2, w.output()
    assert not list((tmp_path / "ckpt").glob("*"))
    # Both ranks stopped after the same step.
    assert ({r["step"] for r in read_log(tmp_path, 4, 0)}
            == {r["step"] for r in read_log(tmp_path, 4, 1)})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("oom_at", [0, 16], ids=["all-fit", "oom-at-16"])
def test_profiling_pass_reports_samples_and_exits_76(tmp_path, oom_at):
    with FakeAgent() as agent:
        w = Workers(tmp_path, 2, 1, SIA_AGENT_SOCKET=agent.path, SIA_PROFILE="16,4,8",
                    SIA_PACE=2, TEST_N=N, TEST_OOM_AT=oom_at)
        assert w.wait() == [EXIT_PROFILED], w.output()
        reports = list(agent.reports)
    assert len(reports) == 1, reports
    (r,) = reports
    assert r.telemetry.profile and r.telemetry.generation == 2
    got = sorted((s.atomic_batch_size, s.num_replicas, s.accum_steps, s.count)
                 for s in r.telemetry.samples)
    fitting = [b for b in (4, 8, 16) if not oom_at or b < oom_at]
    assert got == [(b, 1, 0, 3) for b in fitting]
    assert all(0 <= s.sync_time_s < s.step_time_s for s in r.telemetry.samples)
    if oom_at:
        assert r.oom.atomic_batch_size == 16 and "memory" in r.oom.message
    else:
        assert not r.HasField("oom")
    assert not (tmp_path / "ckpt").exists()  # never the job's checkpoints


@pytest.mark.timeout(60)
def test_oom_in_training_is_reported_and_fails_the_worker(tmp_path):
    with FakeAgent() as agent:
        w = Workers(tmp_path, 1, 1, SIA_AGENT_SOCKET=agent.path, SIA_ATOMIC_BATCH_SIZE=8,
                    TEST_OOM_AT=8, TEST_N=N)
        (code,) = w.wait()
        reports = list(agent.reports)
    assert code not in (0, 75, 76, 77)
    assert [r.oom.atomic_batch_size for r in reports if r.HasField("oom")] == [8]
