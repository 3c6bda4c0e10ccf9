"""The node agent against a scripted controller over a real gRPC stream, on a
manual clock: registration, directive semantics, modeled progress, reconnects."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nodeagent_support import (
    ALLOC,
    SHAPE,
    SPEC,
    expected_finish_s,
    expected_progress,
    make_config,
    run,
    started_agent,
    stop,
    until,
)

from sia_grpc.api import pb
from sia_grpc.emulation import load_app
from sia_grpc.nodeagent import AgentStatus, ModeledBackend, NodeAgent

CIFAR = load_app("cifar10")
KIND = pb.JobExit


def job_telemetry(s, job_id="job-1"):
    return s.of("telemetry", lambda t: t.job_id == job_id and not t.profile)


async def job_telemetry_wait(s, count, job_id="job-1"):
    return await s.wait("telemetry", lambda t: t.job_id == job_id and not t.profile,
                        count=count)


def running(agent: NodeAgent) -> list[tuple[str, int, list[int]]]:
    return [(r.job_id, r.generation, list(r.local_gpus)) for r in agent.backend.running()]


async def test_registers_inventory_then_heartbeats_on_the_controllers_interval(
        controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    assert s.register == pb.Register(
        node_id="node-a", gpus=[pb.GpuInventory(gpu_type="rtx", count=8)],
        agent_version="test-1", instance_id=agent.instance_id, isolation="modeled")
    assert len(agent.instance_id) == 32  # random: another agent's differs
    await until(lambda: agent.status is AgentStatus.REGISTERED)
    assert s.of("heartbeat") == []  # nothing before time moves
    # Registered says 1 s (the config's fallback is 5 s): three in three seconds.
    await clock.advance(3.0)
    await s.wait("heartbeat", count=3)
    assert len(s.of("heartbeat")) == 3
    assert s.of("telemetry") == []  # no jobs, nothing to report


async def test_run_reports_exact_progress_then_completes_at_the_modeled_time(
        controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    restore = 0.96  # 4% left (2.6 clock s): crosses epoch ends, where the rate changes
    s.directive(**run(1, restore=restore))
    (ack,) = await s.wait("ack")
    assert ack == pb.DirectiveAck(directive_id=1, job_id="job-1", generation=1, ok=True)
    assert running(agent) == [("job-1", 1, [0, 1])]

    _, step, sync = CIFAR.progress_rate(*SHAPE, restore * CIFAR.max_progress)
    iteration = step + (step - sync) * ALLOC.accum_steps
    await clock.advance(2.0)  # 120 modeled s: 50 restoring, 10 and then 70 training
    t1, t2 = await job_telemetry_wait(s, 2)
    for t, trained in ((t1, 10.0), (t2, 70.0)):
        p = expected_progress(CIFAR, restore, trained)
        assert t.generation == 1 and not t.profile
        assert t.progress == pytest.approx(p / CIFAR.max_progress, rel=1e-12)
        grad = CIFAR.grad_params(p, ALLOC.batch_size)  # measured at the batch it runs
        assert (t.grad.sqr, t.grad.var) == (grad.sqr, grad.var)
    assert t2.progress > t1.progress > restore
    # One sample of the job's own shape, counting the steps since the last report.
    assert [list(t.samples) for t in (t1, t2)] == [
        [pb.ThroughputSample(gpu_type="rtx", num_nodes=1, num_replicas=2, atomic_batch_size=128,
                             accum_steps=1, step_time_s=step, sync_time_s=sync, count=n)]
        for n in (int(10.0 / iteration), int(70.0 / iteration) - int(10.0 / iteration))]
    # The two reports straddle an epoch end.
    assert CIFAR.epoch(expected_progress(CIFAR, restore, 10.0)) < \
        CIFAR.epoch(expected_progress(CIFAR, restore, 70.0))

    finish = expected_finish_s(CIFAR, restore) / 60.0  # clock seconds
    await clock.advance_to(finish * (1 - 1e-9))
    assert running(agent) == [("job-1", 1, [0, 1])] and s.of("exit") == []
    await clock.advance_to(finish)
    assert running(agent) == []  # GPUs free without any directive
    (done,) = await s.wait("exit")
    assert done == pb.JobExit(job_id="job-1", generation=1, kind=KIND.KIND_COMPLETED,
                              progress=1.0)
    reports = [t.progress for t in job_telemetry(s)]
    assert reports == sorted(reports)
    # A batch-change RUN that crossed the completion does not start it again.
    s.directive(**run(3, restore=restore))
    (ack3,) = await s.wait("ack", lambda a: a.directive_id == 3)
    assert ack3.ok and running(agent) == []
    # The freed GPUs take a new job.
    s.directive(**run(2, job_id="job-2"))
    (ack2,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack2.ok, ack2.error


async def test_stop_checkpoints_before_the_ack_and_freezes_progress(controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**run(1))
    await s.wait("ack")
    await clock.advance(2.0)  # 70 modeled s of training
    await job_telemetry_wait(s, 2)
    s.directive(**stop(2))
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack.ok
    (ex,) = s.of("exit")
    assert ex.kind == KIND.KIND_CHECKPOINTED and ex.generation == 1
    assert ex.progress == pytest.approx(
        expected_progress(CIFAR, 0.0, 70.0) / CIFAR.max_progress, rel=1e-12)
    assert s.index("exit") < s.index("ack", lambda a: a.directive_id == 2)
    assert running(agent) == []

    await clock.advance(3.0)
    await s.wait("heartbeat", count=5)
    assert len(job_telemetry(s)) == 2  # stopped: no more reports

    # The next generation resumes from the checkpoint the controller was told of.
    s.directive(**run(3, generation=2, restore=ex.progress))
    await s.wait("ack", lambda a: a.directive_id == 3)
    await clock.advance(1.0)
    (t,) = await s.wait("telemetry", lambda t: t.generation == 2)
    assert t.progress == pytest.approx(
        expected_progress(CIFAR, ex.progress, 10.0) / CIFAR.max_progress, rel=1e-12)


async def test_a_stops_exit_rides_in_its_ack_to_a_controller_that_reads_it_there(
        controller, agent, clock):
    """`Registered.acks_carry_exits`: the checkpoint's JobExit goes inside the STOP's
    ack (one message, not two), the same exit a controller without it gets before the
    ack (the test above); a RUN's own ack carries none."""
    ctl, _ = controller
    ctl.acks_carry_exits = True
    s = await ctl.stream()
    await until(lambda: agent.status is AgentStatus.REGISTERED)
    s.directive(**run(1))
    (ack1,) = await s.wait("ack")
    assert ack1.ok and not ack1.HasField("exit")
    await clock.advance(2.0)  # 70 modeled s of training
    await job_telemetry_wait(s, 2)
    s.directive(**stop(2))
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack.ok and s.of("exit") == []
    assert ack.exit.kind == KIND.KIND_CHECKPOINTED and ack.exit.generation == 1
    assert ack.exit.job_id == "job-1"
    assert ack.exit.progress == pytest.approx(
        expected_progress(CIFAR, 0.0, 70.0) / CIFAR.max_progress, rel=1e-12)
    assert running(agent) == []


async def test_stop_of_a_job_not_running_here_is_acked(controller, agent):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**stop(5, job_id="elsewhere"))
    (ack,) = await s.wait("ack")
    assert ack == pb.DirectiveAck(directive_id=5, job_id="elsewhere", generation=1, ok=True)
    assert s.of("exit") == []


class CountingBackend(ModeledBackend):
    starts = 0

    async def start(self, launch, on_exit):
        self.starts += 1
        await super().start(launch, on_exit)


async def test_redelivered_directive_gets_the_same_ack_and_changes_nothing(controller, clock):
    ctl, port = controller
    backend = CountingBackend("rtx", time_scale=60.0, clock=clock)
    async with started_agent(port, clock, backend=backend) as agent:
        s = await ctl.stream()
        s.directive(**run(1))
        (first,) = await s.wait("ack")
        await clock.advance(1.0)
        s.directive(**run(1))  # e.g. re-sent after a reconnect
        acks = await s.wait("ack", count=2)
        assert acks[1] == first and backend.starts == 1
        s.directive(**stop(2))
        await s.wait("ack", lambda a: a.directive_id == 2)
        s.directive(**run(1))  # a late duplicate must not restart the stopped job
        acks = await s.wait("ack", lambda a: a.directive_id == 1, count=3)
        assert acks[2] == first
        assert backend.starts == 1 and running(agent) == []


async def test_stale_generation_is_rejected_and_changes_nothing(controller, agent):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**run(1, generation=2))
    await s.wait("ack")
    s.directive(**run(2, generation=1, gpus=(3,)))
    s.directive(**stop(3, generation=1))
    stale_run, stale_stop = await s.wait("ack", lambda a: a.directive_id in (2, 3), count=2)
    assert stale_run == pb.DirectiveAck(directive_id=2, job_id="job-1", generation=1, ok=False,
                                        error="stale generation 1 (running 2)")
    assert not stale_stop.ok and stale_stop.error == "stale generation 1 (running 2)"
    assert running(agent) == [("job-1", 2, [0, 1])] and s.of("exit") == []


async def test_run_of_a_newer_generation_stops_the_old_one_first(controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**run(1, generation=1, gpus=(0, 1)))
    await s.wait("ack")
    await clock.advance(1.0)  # 10 modeled s of training
    s.directive(**run(2, generation=2, gpus=(1, 2)))  # may reuse the old one's GPU
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack.ok, ack.error
    (ex,) = s.of("exit")
    assert (ex.generation, ex.kind) == (1, KIND.KIND_CHECKPOINTED)
    assert ex.progress == pytest.approx(
        expected_progress(CIFAR, 0.0, 10.0) / CIFAR.max_progress, rel=1e-12)
    assert s.index("exit") < s.index("ack", lambda a: a.directive_id == 2)
    assert running(agent) == [("job-1", 2, [1, 2])]


@pytest.mark.parametrize(("changes", "error"), [
    (dict(local_gpus=[]), "local_gpus: empty"),
    (dict(local_gpus=[0, 0]), "local_gpus: GPU 0 listed twice"),
    (dict(local_gpus=[7, 8]), "local_gpus: GPU 8 does not exist (this node has GPUs 0..7)"),
    (dict(local_gpus=[3, 4]), "local_gpus: GPU 4 is held by job other generation 1"),
    (dict(spec=pb.JobSpec(application="nope")), "spec.application: unknown 'nope'"),
    (dict(allocation=pb.Allocation(gpu_type="a100", num_nodes=1, num_replicas=1,
                                   atomic_batch_size=8)),
     "allocation.gpu_type: 'a100' does not match this node's 'rtx'"),
    (dict(restore_progress=1.5), "restore_progress: must be a fraction in [0, 1]"),
])
async def test_bad_run_is_rejected_with_a_clear_error(controller, agent, changes, error):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**run(1, job_id="other", gpus=(4, 5)))
    await s.wait("ack")
    s.directive(**run(2) | changes)
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert not ack.ok and ack.error.startswith(error), ack.error
    assert running(agent) == [("other", 1, [4, 5])]


async def test_profile_holds_the_gpu_then_reports_in_range_sizes(controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    lo, hi = CIFAR.local_bsz_limits("rtx")
    assert (lo, hi) == (32, 1024)
    s.send(profile=pb.ProfileRequest(job_id="p", generation=0, spec=SPEC, local_gpu=3,
                                     local_batch_sizes=[16, 64, 128, 64, 2048]))
    times = {b: CIFAR.step_time("rtx", 1, 1, b) for b in (64, 128)}
    busy = 5 * (times[64][0] + times[128][0]) / 60.0  # 5 steps each, in clock seconds
    await until(lambda: agent.profiling)
    s.directive(**run(1, gpus=(3,)))
    (ack,) = await s.wait("ack")
    assert ack.error == "local_gpus: GPU 3 is profiling job p"
    await clock.advance_to(busy * (1 - 1e-9))
    assert s.of("telemetry", lambda t: t.profile) == []
    await clock.advance_to(busy)
    (t,) = await s.wait("telemetry", lambda t: t.profile)
    assert t == pb.Telemetry(job_id="p", generation=0, profile=True, profile_gpu=3, samples=[
        pb.ThroughputSample(gpu_type="rtx", num_nodes=1, num_replicas=1, atomic_batch_size=b,
                            accum_steps=0, step_time_s=step, sync_time_s=sync, count=5)
        for b, (step, sync) in times.items()],
        grad=pb.GradientStats(sqr=CIFAR.grad_params(0.0).sqr, var=CIFAR.grad_params(0.0).var))
    s.directive(**run(2, gpus=(3,)))  # released
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack.ok, ack.error


async def test_a_stop_ends_the_jobs_profiling_pass_before_its_ack(controller, agent, clock):
    """The controller stops an ended job's passes (a GPU must not stay booked to a
    job deleted while it was profiled): the pass ends, reports nothing, and its
    GPU takes a RUN right after the STOP's ack."""
    ctl, _ = controller
    s = await ctl.stream()
    s.send(profile=pb.ProfileRequest(job_id="p", generation=0, spec=SPEC, local_gpu=3,
                                     local_batch_sizes=[64, 128]))
    await until(lambda: agent.profiling)
    s.directive(directive_id=1, job_id="p", generation=0, action=pb.Directive.ACTION_STOP)
    (ack,) = await s.wait("ack")
    assert ack.ok and not agent.profiling
    s.directive(**run(2, gpus=(3,)))
    (ack,) = await s.wait("ack", lambda a: a.directive_id == 2)
    assert ack.ok, ack.error
    await clock.advance_to(3600.0)
    assert s.of("telemetry", lambda t: t.profile) == []


async def test_gpu_type_without_profiles_gets_empty_profile_and_refuses_runs(
        controller, clock):
    ctl, port = controller
    async with started_agent(port, clock, gpu_type="h100"):
        s = await ctl.stream()
        s.send(profile=pb.ProfileRequest(job_id="p", generation=0, spec=SPEC, local_gpu=0,
                                         local_batch_sizes=[64, 128]))
        (t,) = await s.wait("telemetry")
        assert t == pb.Telemetry(job_id="p", generation=0, profile=True, profile_gpu=0,
                                 profile_error="cifar10 has no profile for GPU type 'h100'")
        s.directive(**run(1, allocation=pb.Allocation(num_nodes=1, num_replicas=1,
                                                      atomic_batch_size=64)))
        (ack,) = await s.wait("ack")
        assert ack.error == "spec.application: cifar10 has no profile for this node's " \
                            "GPU type 'h100'"


async def test_drain_refuses_new_runs_but_still_stops(controller, agent):
    ctl, _ = controller
    s = await ctl.stream()
    s.directive(**run(1))
    await s.wait("ack")
    s.send(drain=pb.Drain(reason="maintenance"))
    s.directive(**run(2, job_id="job-2", gpus=(2,)))
    s.directive(**stop(3))
    refused, stopped = await s.wait("ack", lambda a: a.directive_id > 1, count=2)
    assert agent.draining
    assert not refused.ok and refused.error == "node draining (maintenance)"
    assert stopped.ok and running(agent) == []
    s.send(drain=pb.Drain(cancel=True))  # the drain is over: it runs jobs again
    s.directive(**run(4, job_id="job-2", gpus=(2,)))
    (again,) = await s.wait("ack", lambda a: a.directive_id == 4)
    assert again.ok and not agent.draining


async def test_other_ranks_of_a_multinode_job_only_hold_gpus(controller, agent, clock):
    ctl, _ = controller
    s = await ctl.stream()
    world = pb.WorldLayout(world_size=4, rank_offset=2, master_addr="node-b", master_port=1,
                           nodes=["node-b", "node-a"])
    alloc = pb.Allocation(gpu_type="rtx", num_gpus=4, num_nodes=2, num_replicas=4,
                          atomic_batch_size=128)
    s.directive(**run(1, restore=0.25, world=world, allocation=alloc))
    (ack,) = await s.wait("ack")
    assert ack.ok, ack.error
    await clock.advance(3.0)
    await s.wait("heartbeat", count=3)
    assert s.of("telemetry") == [] and running(agent) == [("job-1", 1, [0, 1])]
    s.directive(**stop(2))
    await s.wait("ack", lambda a: a.directive_id == 2)
    # It knows no better progress than what it was given; the leader reports the real one.
    assert s.of("exit") == [pb.JobExit(job_id="job-1", generation=1,
                                       kind=KIND.KIND_CHECKPOINTED, progress=0.25)]


async def test_reconnects_with_backoff_and_reregisters_its_running_job(controller, clock):
    ctl, port = controller
    attempts: list[int] = []

    def backoff(attempt: int) -> float:
        attempts.append(attempt)
        return 5.0

    async with started_agent(port, clock, backoff=backoff) as agent:
        s0 = await ctl.stream()
        s0.directive(**run(1))
        await s0.wait("ack")
        await clock.advance(1.0)
        await job_telemetry_wait(s0, 1)

        ctl.refuse = 2  # the controller is back only on the third try
        s0.drop()
        for n in (1, 2, 3):
            await until(lambda n=n: len(attempts) == n)
            assert agent.status is AgentStatus.BACKOFF
            await clock.advance(5.0)  # the job trains on meanwhile
        assert attempts == [0, 1, 2]
        s1 = await ctl.stream(1)
        assert s1.register.instance_id == s0.register.instance_id  # the same agent, back
        assert list(s1.register.running) == [
            pb.RunningJob(job_id="job-1", generation=1, local_gpus=[0, 1])]
        await until(lambda: agent.status is AgentStatus.REGISTERED)
        assert clock.time() == 16.0
        await clock.advance(1.0)
        (t,) = await job_telemetry_wait(s1, 1)
        assert t.progress == pytest.approx(  # 17 clock s = 1020 modeled, 50 restoring
            expected_progress(CIFAR, 0.0, 17 * 60.0 - 50.0) / CIFAR.max_progress, rel=1e-12)

        # A directive acked on the old stream is re-delivered on the new one: same ack.
        s1.directive(**run(1))
        (again,) = await s1.wait("ack")
        assert again == s0.of("ack")[0]

        s1.drop()  # registration succeeded, so the backoff starts afresh
        await until(lambda: len(attempts) == 4)
        assert attempts[3] == 0



class HeldStops(ModeledBackend):
    """Modeled workers whose stop waits for `release` (a slow checkpoint)."""

    def __init__(self, clock) -> None:
        super().__init__("rtx", time_scale=60.0, clock=clock, node_id="node-a")
        self.stopping, self.release = asyncio.Event(), asyncio.Event()

    async def stop(self, job_id: str) -> pb.JobExit:
        self.stopping.set()
        await self.release.wait()
        return await super().stop(job_id)


async def test_the_register_lists_all_that_runs_and_nothing_older_starts_after_it(
        controller, clock):
    """The stream breaks while a move is under way (the old generation checkpointing)
    and a profile request and a STOP wait behind it. The next Register waits for
    the move and lists what then runs; what was not begun is dropped (the
    controller re-sends what it still wants). Before, the Register went out at
    once and the move and the pass started after it, on GPUs the new leader's
    books called free."""
    ctl, port = controller
    backend = HeldStops(clock)
    async with started_agent(port, clock, backend=backend) as agent:
        s0 = await ctl.stream()
        s0.directive(**run(1))
        await s0.wait("ack")
        s0.directive(**run(2, generation=2))  # the move: generation 1 stops first
        s0.send(profile=pb.ProfileRequest(job_id="p", generation=0, spec=SPEC, local_gpu=5,
                                          local_batch_sizes=[64]))
        s0.directive(**stop(3, job_id="other"))
        await until(lambda: len(agent.received) == 3 and backend.stopping.is_set())
        s0.drop()
        # (With the rule the Register waits for the move, so no stream comes here.)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await ctl.stream(1)
        backend.release.set()
        s1 = await ctl.stream(1)
        (ack,) = await s1.wait("ack")
        assert ack.directive_id == 2 and ack.ok, ack
        await clock.advance(1.0)
        assert list(s1.register.running) == [
            pb.RunningJob(job_id="job-1", generation=2, local_gpus=[0, 1])]
        assert list(s1.register.profiling) == [] and dict(agent.profiling) == {}
        assert running(agent) == [("job-1", 2, [0, 1])]
        assert s0.of("ack") + s1.of("ack") == [s0.of("ack")[0], ack]  # STOP 3: dropped


async def test_a_pass_that_ended_while_disconnected_is_listed_until_its_report_is_sent(
        controller, clock):
    """Its report waits in the outbox and follows the next Register: the Register
    lists the pass, so the controller books its GPU until the report comes rather
    than ask for the same job's pass there again and take the old report for the
    new pass's (which would then run on a GPU its books call free)."""
    ctl, port = controller
    async with started_agent(port, clock, backoff=lambda attempt: 5.0) as agent:
        s0 = await ctl.stream()
        s0.send(profile=pb.ProfileRequest(job_id="p", generation=0, spec=SPEC, local_gpu=3,
                                          local_batch_sizes=[64]))
        await until(lambda: agent.profiling)
        s0.drop()
        await until(lambda: agent.status is AgentStatus.BACKOFF)
        await clock.advance(4.0)  # the pass ends (in well under a second) meanwhile
        assert not agent.profiling
        await clock.advance(1.0)
        s1 = await ctl.stream(1)
        assert list(s1.register.profiling) == [
            pb.ProfilingPass(job_id="p", generation=0, local_gpu=3)]
        (t,) = await s1.wait("telemetry", lambda t: t.profile)
        assert t.job_id == "p" and t.profile_gpu == 3 and t.samples
        assert s1.index("telemetry", lambda t: t.profile) > 0  # right behind the Register

async def test_close_checkpoints_jobs_is_idempotent_and_leaves_no_tasks(controller, clock):
    ctl, port = controller
    async with started_agent(port, clock) as agent:
        s = await ctl.stream()
        s.directive(**run(1))
        await s.wait("ack")
        await clock.advance(1.0)
        # A slow controller: the JobExit must still arrive, so close() half-closes
        # and waits for the controller to end the call (cancelling would lose it).
        s.read_delay_s = 0.1
        await agent.close()
        assert s.ended.is_set()
        await agent.close()
        assert agent.status is AgentStatus.CLOSED
        (ex,) = s.of("exit")
        assert ex.kind == KIND.KIND_CHECKPOINTED and ex.progress > 0
        with pytest.raises(RuntimeError, match="closed"):
            await agent.start()
    # started_agent closed it a third time and found no tasks left behind


async def test_close_while_the_controller_is_unreachable(clock):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with started_agent(port, clock, backoff=lambda attempt: 60.0) as agent:
        await until(lambda: agent.status is AgentStatus.BACKOFF)
    assert agent.status is AgentStatus.CLOSED


async def test_close_before_start():
    agent = NodeAgent(make_config(1))
    await agent.close()
    await agent.close()
    assert agent.status is AgentStatus.CLOSED


async def test_a_write_to_a_stream_the_controller_ended_fails_as_a_broken_stream(controller):
    """A report written just after the controller went away (killed in a failover)
    fails with the call's status, as its reads do (a warning and a reconnect,
    `_stream_failed`), not with "RPC already finished" logged as an unexpected
    error; the report is kept for the next stream. A call it ended cleanly: the
    stream is simply over."""
    import grpc

    from sia_grpc.api import AgentServiceStub

    ctl, port = controller
    agent = NodeAgent(make_config(port))
    register = pb.AgentMessage(register=pb.Register(node_id="node-a"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        ctl.refuse = 1  # the first stream is aborted: UNAVAILABLE
        aborted = AgentServiceStub(channel).Connect()
        await aborted.write(register)
        assert await aborted.code() == grpc.StatusCode.UNAVAILABLE
        agent._outbox.send(heartbeat=pb.Heartbeat())
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await agent._write(aborted)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert [m.WhichOneof("kind") for m in agent._outbox] == ["heartbeat"]  # kept

        ended = AgentServiceStub(channel).Connect()
        await ended.write(register)
        assert (await ended.read()).WhichOneof("kind") == "registered"
        (await ctl.stream()).drop()
        assert await ended.code() == grpc.StatusCode.OK
        await agent._write(ended)  # returns: the stream is over
        assert [m.WhichOneof("kind") for m in agent._outbox] == ["heartbeat"]
