"""The controller's state machine, driven synchronously (no sockets, no clock)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from harness import FakeAgent, Harness, refused_pass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sia_grpc.api import TERMINAL_STATES, pb
from sia_grpc.controller.machine.events import ControllerSettings
from sia_grpc.controller.machine.records import JobRec, live_rendezvous, load_extra
from sia_grpc.controller.machine.state import (
    AgentDisconnected,
    AgentMessage,
    ControllerState,
    InvariantError,
    JobCancelRequested,
    JobDeleted,
    Liveness,
    NodeDrainChanged,
    NodeForgotten,
    Persist,
    RoundAcked,
    RoundSkipped,
    Send,
    Solve,
    SolveFinished,
    Tick,
    WantRound,
)
from sia_grpc.policy import JobAllocation
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.types import RoundResult

NODES = {"rtx-0": ("rtx", 8), "aws-0": ("aws", 4), "aws-1": ("aws", 4)}


def sends(actions, kind):
    return [a for a in actions if isinstance(a, Send) and a.message.WhichOneof("kind") == kind]


def test_new_job_is_profiled_on_each_type_then_scheduled_and_completes():
    h = Harness(NODES)
    h.submit("j1")
    assert h.state_of("j1") == pb.JOB_STATE_PROFILING
    profiles = [s for s in h.outbox if s.message.WhichOneof("kind") == "profile"]
    assert sorted(h.agents[s.node_id].gpu_type for s in profiles) == ["aws", "rtx"]
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_QUEUED
    assert h.state.jobs["j1"].usable == {"aws", "rtx"}
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING and rec.generation == 1
    assert rec.job.status.HasField("allocation") and rec.job.status.reason
    assert sum(len(a.busy) for a in h.agents.values()) == rec.alloc.config.num_gpus
    h.complete("j1")
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_SUCCEEDED
    assert not any(a.busy for a in h.agents.values())
    assert not any(n.holder for n in h.state.nodes.values())
    assert "j1" in h.persisted


def test_profile_request_uses_batch_sizes_within_the_types_limits():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    (p,) = [s.message.profile for s in h.outbox]
    lo, hi = h.state.jobs["j1"].res.local_bsz_limits["rtx"]
    assert 5 <= len(p.local_batch_sizes) <= 10
    assert min(p.local_batch_sizes) == lo and max(p.local_batch_sizes) == hi


def test_a_job_whose_passes_all_fail_says_why_in_its_message():
    """Regression: a job whose command the agents cannot run (not found, a crash)
    failed with only "profiling found none"; the agents' reasons were in their logs."""
    h = Harness({"rtx-0": ("rtx", 4), "aws-0": ("aws", 4)})
    for a in h.agents.values():
        a.hold_profiles = True
    h.submit("j1")
    h.deliver()
    for a in h.agents.values():
        (p,) = a.passes.values()
        h.feed(AgentMessage(h.now, a.name, pb.AgentMessage(telemetry=pb.Telemetry(
            job_id="j1", generation=p.generation, profile=True, profile_gpu=p.local_gpu,
            profile_error=f"RuntimeError: no train.py on {a.name}"))))
    status = h.state.jobs["j1"].job.status
    assert status.state == pb.JOB_STATE_FAILED and "profiling found none" in status.reason
    assert status.message == ("aws: RuntimeError: no train.py on aws-0\n"
                              "rtx: RuntimeError: no train.py on rtx-0")


def test_a_job_that_grows_is_stopped_before_it_runs_again():
    h = Harness(NODES)
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    first = h.state.jobs["j1"].alloc
    for _ in range(6):  # Sia doubles at most each round while it gains
        h.tick()
        h.deliver()
    rec = h.state.jobs["j1"]
    assert rec.alloc.config.num_gpus > first.config.num_gpus
    assert rec.job.status.restarts >= 1 and rec.generation == rec.job.status.restarts + 1
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING


def test_many_jobs_share_without_double_allocation_and_all_finish():
    h = Harness(NODES)
    for k in range(8):
        h.submit(f"j{k}", application=["cifar10", "bert", "deepspeech2"][k % 3])
    h.deliver()
    for _ in range(30):
        h.tick()
        h.deliver()
        running = [j for j, r in h.state.jobs.items() if r.state == pb.JOB_STATE_RUNNING
                   and r.held]
        if running:
            h.complete(running[0])
            h.deliver()
    assert all(h.state_of(f"j{k}") == pb.JOB_STATE_SUCCEEDED for k in range(8))


def test_only_one_solve_in_flight():
    h = Harness(NODES)
    h.submit("j1")
    h.deliver()
    h.now += 60
    h.heartbeat()
    first = h.state.handle(Tick(h.now))
    assert any(isinstance(a, Solve) for a in first)
    again = h.state.handle(Tick(h.now))
    assert not any(isinstance(a, Solve) for a in again)


def test_lost_agent_requeues_its_jobs_which_then_run_elsewhere():
    h = Harness({"rtx-0": ("rtx", 8), "rtx-1": ("rtx", 8)}, policy="gavel")
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=512)
    h.deliver()
    h.tick()
    h.deliver()
    node = h.state.jobs["j1"].alloc.gpus[0].node
    h.agents[node].up = False
    h.agents[node].running.clear()
    h.agents[node].busy.clear()
    h.tick(31.0)  # past the heartbeat timeout: requeued, and rescheduled in the same round
    rec = h.state.jobs["j1"]
    assert h.state.nodes[node].state == pb.NODE_STATE_LOST
    assert rec.job.status.restarts == 1
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING
    assert {g.node for g in rec.alloc.gpus} == {({"rtx-0", "rtx-1"} - {node}).pop()}


def test_agent_reconnecting_with_a_stale_generation_is_fenced():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    gen = h.state.jobs["j1"].generation
    agent = h.agents["rtx-0"]
    agent.running["j1"] = (gen - 1 if gen > 1 else 0, agent.running["j1"][1], 0)
    actions = h.feed(agent.register_event(h.now))
    stops = [s for s in sends(actions, "directive")
             if s.message.directive.action == pb.Directive.ACTION_STOP]
    assert [s.message.directive.job_id for s in stops] == ["j1"]


def test_redelivered_ack_changes_nothing():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.tick()
    (run,) = [s for s in h.outbox if s.message.WhichOneof("kind") == "directive"]
    h.deliver()
    before = h.state.jobs["j1"].job.SerializeToString()
    ack = pb.DirectiveAck(directive_id=run.message.directive.directive_id, job_id="j1",
                          generation=run.message.directive.generation, ok=False, error="dup")
    h.feed(AgentMessage(h.now, "rtx-0", pb.AgentMessage(ack=ack)))
    assert h.state.jobs["j1"].job.SerializeToString() == before


def test_cancel_stops_the_job_and_frees_its_gpus():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    actions = h.feed(JobCancelRequested(h.now, "j1"))
    assert h.state_of("j1") == pb.JOB_STATE_CANCELLED
    assert any(isinstance(a, Persist) and "j1" in a.job_ids for a in actions)
    h.deliver()
    assert not h.agents["rtx-0"].busy and not h.state.nodes["rtx-0"].holder


@pytest.mark.parametrize("order", ["stop-first", "result-first", "agent-lost", "result-lost"])
def test_a_job_deleted_while_profiling_frees_its_gpu(order):
    """Regression (defect: a GPU leaked for ever): `sia cancel` then `sia delete` while
    the job's profiling pass ran dropped the record, so the pass's result was
    ignored and its GPU stayed booked to a job that no longer existed. Rule: a job
    that ends stops its passes, and its record goes only when every GPU it holds
    has a STOP in flight (whose ack frees it), whatever order the rest arrives in."""
    h = Harness({"rtx-0": ("rtx", 4)})
    h.agents["rtx-0"].hold_profiles = True
    h.submit("j1")
    h.deliver()  # the pass starts and runs
    assert h.state.nodes["rtx-0"].holder and h.agents["rtx-0"].passes
    actions = h.feed(JobCancelRequested(h.now, "j1"))
    stops = [a for a in sends(actions, "directive")
             if a.message.directive.action == pb.Directive.ACTION_STOP]
    assert [a.node_id for a in stops] == ["rtx-0"]  # the pass is stopped, not left to run
    h.feed(JobDeleted(h.now, "j1"))
    if order == "stop-first":
        h.deliver()
    elif order == "result-first":  # an agent that finished the pass before the STOP
        h.finish_profiles()
        h.deliver()
    elif order == "agent-lost":  # the node went silent with the STOP unanswered
        h.agents["rtx-0"].up = False
        h.now += 60
        h.feed(Liveness(h.now))
        h.agents["rtx-0"].up = True
        h.agents["rtx-0"].passes.clear()
        h.feed(h.agents["rtx-0"].register_event(h.now))
        h.deliver()
    else:  # the stream broke: the STOP is re-sent when the agent registers again
        h.outbox.clear()
        h.feed(h.agents["rtx-0"].register_event(h.now))
        h.deliver()
    h.assert_no_gpu_held()
    h.submit("j2")  # and the GPU is usable again
    h.finish_profiles()
    h.deliver()
    h.finish_profiles()
    h.tick()
    h.deliver()
    assert h.state_of("j2") == pb.JOB_STATE_RUNNING


def test_a_move_whose_node_is_lost_before_it_starts_is_requeued_not_run_there():
    """Regression (found by the invariant check in the chaos run): a job whose target
    node was lost while its old workers were stopping was RUN on the lost node once
    they stopped, and stayed RUNNING there for ever. Rule: a RUN goes only to ready
    nodes; a move whose target left the pool is requeued."""
    h = Harness({"rtx-0": ("rtx", 4), "aws-0": ("aws", 4)})
    h.submit("j1", allowed_gpu_types=["rtx", "aws"], max_gpus=1)
    h.deliver()
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    src = rec.alloc.gpus[0].node
    dst = "aws-0" if src == "rtx-0" else "rtx-0"
    h.state.handle(Tick(h.now, "timer"))  # a round the test answers itself: move j1
    a = rec.alloc
    moved = JobAllocation(config=Config(h.state.nodes[dst].gpu_type, 1, 1),
                          gpus=(GpuId(dst, 0),), num_replicas=1, batch_size=a.batch_size,
                          atomic_bsz=a.atomic_bsz, accum_steps=0, goodput=1.0)
    h.feed(SolveFinished(h.now, h.state.solving, RoundResult(
        allocations={"j1": moved}, restarted=frozenset({"j1"}), objective=0.0, timings={},
        reasons={"j1": "moved"})))
    assert rec.moving and rec.target is not None and rec.held  # STOP sent to src
    h.agents[dst].up = False
    h.now += h.state.settings.heartbeat_timeout + 1
    h.heartbeat()
    h.feed(Liveness(h.now))  # dst is lost before src's workers stopped
    h.deliver()  # src stops: the move cannot start on a lost node
    assert rec.state == pb.JOB_STATE_QUEUED and rec.alloc is None
    assert not h.state.nodes[dst].holder and "left the pool" in rec.job.status.reason


def test_an_agent_that_missed_the_end_of_its_drain_is_told_when_it_registers():
    """Regression (chaos run): the undrain was sent while the agent's stream was down,
    so it refused every RUN for ever while the controller saw a ready node. Rule: on
    registration the agent reports whether it drains, and is told where that differs."""
    h = Harness({"rtx-0": ("rtx", 4)})
    h.feed(NodeDrainChanged(h.now, "rtx-0", "fan"))
    h.deliver()
    assert h.agents["rtx-0"].draining
    h.feed(NodeDrainChanged(h.now, "rtx-0", None))
    h.outbox.clear()  # lost with the stream
    actions = h.feed(h.agents["rtx-0"].register_event(h.now))
    assert [s.message.drain.cancel for s in sends(actions, "drain")] == [True]
    h.deliver()
    assert not h.agents["rtx-0"].draining
    actions = h.feed(h.agents["rtx-0"].register_event(h.now))  # in step: nothing to say
    assert sends(actions, "drain") == []


def test_an_early_round_asked_for_during_a_solve_runs_after_it():
    """Regression (defect: a new job waited a whole round with GPUs idle): an early
    round that came while the timer round was being solved was dropped."""
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.now += 60
    h.heartbeat()
    (solve,) = [a for a in h.state.handle(Tick(h.now, "timer")) if isinstance(a, Solve)]
    assert not [a for a in h.state.handle(Tick(h.now + 2, "arrival", early=True))
                if isinstance(a, Solve)]  # one solve at a time...
    result = h.policy.optimize(solve.cluster, list(solve.jobs), dict(solve.previous))
    actions = h.feed(SolveFinished(h.now + 3, solve.round_no, result))
    assert WantRound("arrival") in actions  # ...and the early round comes right after


def test_a_profile_result_for_no_job_changes_nothing():
    """Regression (found by the agent-stream fuzz): a profile result with an empty job
    id and no GPU raised KeyError(-1) in the state machine."""
    h = Harness({"rtx-0": ("rtx", 4)})
    h.feed(AgentMessage(h.now, "rtx-0", pb.AgentMessage(telemetry=pb.Telemetry(profile=True))))
    h.feed(AgentMessage(h.now, "rtx-0", pb.AgentMessage(telemetry=pb.Telemetry(
        profile=True, profile_gpu=3))))
    assert not h.state.nodes["rtx-0"].holder


def test_the_invariant_check_names_a_leaked_gpu():
    h = Harness({"rtx-0": ("rtx", 4)})
    h.state.nodes["rtx-0"].holder[2] = "ghost"
    with pytest.raises(InvariantError, match="rtx-0/2 held by 'ghost'"):
        h.state.check_invariants()


def test_an_exit_from_a_node_the_job_does_not_run_on_is_ignored():
    """A rogue (or confused) agent cannot end, fail or rewind another node's job."""
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4)})
    h.submit("j1", max_gpus=1)
    h.deliver()
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    (mine,) = rec.held
    other = "rtx-1" if mine == "rtx-0" else "rtx-0"
    for kind in (pb.JobExit.KIND_FAILED, pb.JobExit.KIND_COMPLETED,
                 pb.JobExit.KIND_CHECKPOINTED):
        h.feed(AgentMessage(h.now, other, pb.AgentMessage(exit=pb.JobExit(
            job_id="j1", generation=rec.generation, kind=kind, progress=0.9))))
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING
    assert rec.checkpoint == 0 and rec.job.status.progress < 0.9
    assert set(h.state.nodes[mine].holder.values()) == {"j1"}
    h.complete("j1")  # from the node that runs it, it counts
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_SUCCEEDED


def test_a_round_lists_the_jobs_it_started_and_moved_from_what_to_what():
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4)})
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2, batch_size=256, tenant="t")
    h.deliver()
    h.tick()
    h.deliver()
    (start,) = h.round_done[-1].round.moves
    assert (start.job_id, start.name, start.tenant, start.kind) == ("j1", "j1", "t", "start")
    assert not start.HasField("before")
    (node,) = h.state.jobs["j1"].held
    assert (start.after.gpu_type, start.after.num_gpus) == ("rtx", 2)
    assert {g.node for g in start.after.gpus} == {node}
    h.feed(NodeDrainChanged(h.now, node, "replace GPU 3"))
    h.deliver()
    h.tick(1.0, trigger="drain")
    h.deliver()
    (move,) = h.round_done[-1].round.moves
    assert move.kind == "move" and move.before == start.after
    (other,) = h.state.jobs["j1"].held
    assert {g.node for g in move.after.gpus} == {other} != {node}
    # A round that changes no job's GPUs lists none.
    h.tick()
    h.deliver()
    assert h.round_done[-1].round.jobs_moved == 0 and not h.round_done[-1].round.moves


def test_a_round_that_starts_many_jobs_lists_only_the_first_few_and_counts_them_all():
    from sia_grpc.controller.machine.rounds import ROUND_MOVES_KEPT

    h = Harness({f"rtx-{k}": ("rtx", 8) for k in range(4)})
    jobs = ROUND_MOVES_KEPT + 5
    for k in range(jobs):
        h.submit(f"j{k}", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=1, batch_size=128)
    h.deliver()
    h.tick()
    h.deliver()
    rnd = h.round_done[-1].round
    assert rnd.jobs_moved == jobs and len(rnd.moves) == ROUND_MOVES_KEPT
    assert {m.kind for m in rnd.moves} == {"start"}


def test_a_round_move_says_start_move_resize_or_preempt():
    from sia_grpc.controller.machine.rounds import round_move

    def alloc(gpu_type: str, n: int) -> JobAllocation:
        return JobAllocation(Config(gpu_type, 1, n), tuple(GpuId("n0", i) for i in range(n)))

    h = Harness(NODES)
    h.submit("j1")
    rec = h.state.jobs["j1"]
    kinds = [round_move(rec, a, b).kind for a, b in [
        (None, alloc("rtx", 2)), (alloc("rtx", 2), alloc("rtx", 4)),
        (alloc("rtx", 2), alloc("aws", 2)), (alloc("rtx", 2), alloc("aws", 4)),
        (alloc("rtx", 2), None)]]
    assert kinds == ["start", "resize", "move", "move", "preempt"]
    resize = round_move(rec, alloc("rtx", 2), alloc("rtx", 4))
    assert (resize.before.num_gpus, resize.after.num_gpus) == (2, 4)
    assert not round_move(rec, alloc("rtx", 2), None).HasField("after")


def test_a_tenant_sees_another_tenants_moved_jobs_unnamed():
    from sia_grpc.api import OTHER_TENANT
    from sia_grpc.controller.machine.views import round_for

    rnd = pb.Round(round=3, moves=[pb.RoundMove(job_id="a1", name="mine", tenant="a"),
                                   pb.RoundMove(job_id="b1", name="theirs", tenant="b",
                                                kind="start")])
    assert round_for(rnd, None) is rnd  # an admin: everything
    seen = round_for(rnd, "a")
    assert [(m.job_id, m.name, m.tenant, m.kind) for m in seen.moves] == [
        ("a1", "mine", "a", ""), (OTHER_TENANT, "", "", "start")]
    assert rnd.moves[1].job_id == "b1"  # the controller's own record is untouched


def test_a_drained_node_loses_its_jobs_to_other_nodes_and_gets_no_new_work():
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4)})
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2, batch_size=256)
    h.deliver()
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    (node,) = rec.held
    other = "rtx-1" if node == "rtx-0" else "rtx-0"
    actions = h.feed(NodeDrainChanged(h.now, node, "replace GPU 3"))
    assert h.state.nodes[node].state == pb.NODE_STATE_DRAINING
    assert [s.message.drain.reason for s in sends(actions, "drain")] == ["replace GPU 3"]
    assert WantRound("drain") in actions
    h.deliver()
    assert h.agents[node].draining
    h.tick(1.0, trigger="drain")  # the early round the drain asked for
    h.deliver()
    assert set(rec.held) == {other} and h.state_of("j1") == pb.JOB_STATE_RUNNING
    assert not h.agents[node].busy and not h.state.nodes[node].holder
    assert rec.job.status.restarts == 1
    # A new job is placed elsewhere (or waits), never on the drained node.
    h.submit("j2", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2, batch_size=256)
    h.deliver()
    h.tick()
    h.deliver()
    assert not h.agents[node].busy and h.state.refused == 0
    (shown,) = [n for n in h.state.cluster_pb().nodes if n.name == node]
    assert shown.state == pb.NODE_STATE_DRAINING and shown.drain_reason == "replace GPU 3"
    # Its agent restarts: the drain holds and the agent is told again.
    h.agents[node].draining = False
    actions = h.feed(h.agents[node].register_event(h.now))
    assert h.state.nodes[node].state == pb.NODE_STATE_DRAINING
    assert len(sends(actions, "drain")) == 1
    h.deliver()
    # Undrained: ready again, the agent told, and its GPUs filled by the next round.
    actions = h.feed(NodeDrainChanged(h.now, node, None))
    assert h.state.nodes[node].state == pb.NODE_STATE_READY and node not in h.state.drained
    assert [s.message.drain.cancel for s in sends(actions, "drain")] == [True]
    h.deliver()
    assert not h.agents[node].draining


@pytest.mark.parametrize("others", [{}, {"aws-0": ("aws", 4)}])
def test_a_drain_requeues_jobs_that_have_nowhere_else_to_go(others):
    """Regression (defect: `sia drain n1 --wait` timed out): with no other node the
    job could run on, no round ran and the job stayed RUNNING on the drained node.
    Rule: a job holding GPUs on a node that left the pool and that no ready node can
    run is checkpointed and requeued, saying why; a round that does not run says why."""
    h = Harness({"rtx-0": ("rtx", 4), **others})
    h.submit("j1", allowed_gpu_types=["rtx"])
    h.deliver()
    h.tick()
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING
    h.feed(NodeDrainChanged(h.now, "rtx-0", "replace GPU 3"))
    h.deliver()
    actions = h.feed(Tick(h.now + 2, "drain", early=True))
    h.deliver()
    rec = h.state.jobs["j1"]
    assert rec.state == pb.JOB_STATE_QUEUED and not h.state.nodes["rtx-0"].holder
    assert rec.job.status.reason.startswith("requeued: rtx-0 left the pool and no ready "
                                            "node of type rtx")
    assert rec.job.status.restarts == 1 and not h.agents["rtx-0"].running
    skipped = [a.round.note for a in actions if isinstance(a, RoundSkipped)]
    if not others:
        assert skipped == ["skipped: no ready node (1 draining)"]
    # The reason is said once, not at every tick; undrained, the job runs again.
    h.now += 60
    h.heartbeat()
    assert not [a for a in h.feed(Tick(h.now)) if isinstance(a, RoundSkipped)]
    h.feed(NodeDrainChanged(h.now, "rtx-0", None))
    h.deliver()
    h.tick()
    h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING


def test_a_job_no_node_can_serve_says_so():
    """Regression (defect: a job for h100 on a cluster without one stayed PROFILING
    with "waiting: profiling on each GPU type" for ever). Like Kubernetes' "0/N nodes
    are available", its reason names what it needs and what the cluster has."""
    h = Harness({"rtx-0": ("rtx", 4), "aws-0": ("aws", 4)})
    h.submit("j1", allowed_gpu_types=["h100"])
    h.deliver()
    h.tick()
    rec = h.state.jobs["j1"]
    assert rec.state == pb.JOB_STATE_PROFILING
    assert rec.job.status.reason == ("waiting: no ready node of type h100 "
                                     "(the cluster has aws, rtx)")
    # A job that profiled on rtx only, with the rtx node gone, says the same.
    h.submit("j2", allowed_gpu_types=["rtx"])
    h.deliver()
    h.agents["rtx-0"].up = False
    h.now += h.state.settings.heartbeat_timeout + 1
    h.heartbeat()
    h.feed(Liveness(h.now))
    h.tick()
    assert h.state.jobs["j2"].job.status.reason == ("waiting: no ready node of type rtx "
                                                    "(the cluster has aws)")


def test_a_drain_restored_after_a_restart_applies_before_its_agent_returns():
    h = Harness({"rtx-1": ("rtx", 4)})
    h.state.restore_drain("rtx-0", "bad fan", h.now)
    h.agents["rtx-0"] = FakeAgent("rtx-0", "rtx", 4)
    actions = h.feed(h.agents["rtx-0"].register_event(h.now))
    assert h.state.nodes["rtx-0"].state == pb.NODE_STATE_DRAINING
    assert [s.message.drain.reason for s in sends(actions, "drain")] == ["bad fan"]
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=256)
    h.deliver()
    h.tick()
    h.deliver()
    assert set(h.state.jobs["j1"].held) == {"rtx-1"}


def test_only_a_lost_node_is_forgotten_with_its_drain():
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4)})
    h.feed(NodeDrainChanged(h.now, "rtx-1", "bad fan"))
    h.deliver()
    h.feed(NodeForgotten(h.now, "rtx-1"))  # DRAINING, not LOST: kept
    h.feed(NodeForgotten(h.now, "no-such-node"))
    assert set(h.state.nodes) == {"rtx-0", "rtx-1"} and h.state.drained == {"rtx-1": "bad fan"}
    h.agents["rtx-1"].up = False
    h.tick(31.0)
    assert h.state.nodes["rtx-1"].state == pb.NODE_STATE_LOST
    h.feed(NodeForgotten(h.now, "rtx-1"))
    assert set(h.state.nodes) == {"rtx-0"} and h.state.drained == {}
    assert [n.name for n in h.state.cluster_pb().nodes] == ["rtx-0"]
    # If its agent comes back, it is a new node, not drained.
    h.agents["rtx-1"] = FakeAgent("rtx-1", "rtx", 4)
    h.feed(h.agents["rtx-1"].register_event(h.now))
    assert h.state.nodes["rtx-1"].state == pb.NODE_STATE_READY


def test_a_job_moving_to_a_node_that_is_lost_and_forgotten_is_requeued():
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4)})
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=256)
    h.deliver()
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    (src,) = rec.held
    dst = "rtx-1" if src == "rtx-0" else "rtx-0"
    h.feed(NodeDrainChanged(h.now, src, "move it"))
    h.tick(1.0, trigger="drain")  # moves j1 to dst: STOP sent to src, not yet answered
    assert rec.moving and {g.node for g in rec.target.gpus} == {dst}
    h.agents[dst].up = False
    h.now += 31.0
    h.heartbeat()
    h.feed(Tick(h.now))  # dst is LOST (no round: no ready node)
    h.feed(NodeForgotten(h.now, dst))
    assert dst not in h.state.nodes
    h.deliver()  # src checkpoints; the job waits in the queue instead of for dst
    assert h.state_of("j1") == pb.JOB_STATE_QUEUED and not rec.held and not rec.moving
    h.tick()  # later events run as usual


def test_job_becoming_schedulable_asks_for_an_early_round():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    (send,) = h.outbox
    h.outbox.clear()
    (reply,) = h._answer(h.agents["rtx-0"], send.message)
    actions = h.state.handle(AgentMessage(h.now, "rtx-0", reply))
    assert any(isinstance(a, WantRound) for a in actions)


@pytest.mark.parametrize("trigger", ["timer", "arrival"])
def test_an_early_round_places_waiting_jobs_without_moving_running_ones(trigger):
    h = Harness(NODES)
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    first = h.state.jobs["j1"].alloc
    h.submit("j2")
    h.deliver()  # profiled: j2 is ready to place
    h.tick(60.0, trigger)
    h.deliver()
    assert h.state_of("j2") == pb.JOB_STATE_RUNNING
    grew = h.state.jobs["j1"].alloc.config.num_gpus > first.config.num_gpus
    # A timer round grows j1 (it gains from more GPUs); an early round leaves it be.
    assert grew == (trigger == "timer")
    if trigger != "timer":
        # (its batch may still change in place: that is no move)
        assert h.state.jobs["j1"].alloc.gpus == first.gpus and h.state.jobs["j1"].generation == 1


def test_state_survives_a_restart_through_its_persisted_form():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    rec = h.state.jobs["j1"]
    job, extra = rec.job, h.state.extra("j1")
    fresh = ControllerState(h.state.settings)
    fresh.restore(pb.Job.FromString(job.SerializeToString()), extra, h.now)
    again = fresh.jobs["j1"]
    assert again.generation == rec.generation and again.held == rec.held
    assert again.alloc.gpus == rec.alloc.gpus and again.usable == rec.usable
    # The agent comes back running the same generation: nothing is stopped.
    actions = fresh.handle(h.agents["rtx-0"].register_event(h.now + 1))
    assert not [a for a in sends(actions, "directive")
                if a.message.directive.action == pb.Directive.ACTION_STOP]



def _books_agree_with(h: Harness, agent: FakeAgent) -> None:
    """Every GPU the agent has busy (a worker or a pass) is booked to that job."""
    truth = {**agent.busy, **{g: p.job_id for g, p in agent.passes.items()}}
    holder = h.state.nodes[agent.name].holder
    assert {g: holder.get(g) for g in truth} == truth, f"books {holder}, agent {truth}"


def test_a_new_leader_books_no_gpu_of_a_node_before_its_agent_reports():
    """After a failover the new leader's books come from the store: a node its jobs
    held is there before its agent registers, but a profiling pass the old leader
    started on it is not (passes are not stored). Booking that node's "free" GPUs
    then (a pass of another job, a round's RUN) clashed with the pass the agent
    reports: the agent refused, the refusal freed the GPU in the books while the
    pass ran on, and every round sent a job there again (`sia bench failover`:
    hundreds of refused RUNs). A node's GPUs are given out only once its agent has
    said what runs on them."""
    h = Harness({"rtx-0": ("rtx", 4)})
    agent = h.agents["rtx-0"]
    rigid = dict(adaptivity=pb.ADAPTIVITY_RIGID, batch_size=256)
    for job_id, n in (("a", 2), ("b", 1)):  # a on GPUs 0-1, b above them
        h.submit(job_id, num_gpus=n, **rigid)
        h.deliver()
        h.tick()
        h.deliver()
    h.complete("a")
    h.deliver()
    agent.hold_profiles = True
    h.submit("p")  # its pass takes GPU 0 and is still running at the kill
    h.submit("q", num_gpus=1, **rigid)  # profiled, waiting for its first round
    h.deliver()
    for reply in h._profiled(agent, 1):
        h.feed(AgentMessage(h.now, agent.name, reply))
    h.submit("r")  # the leader is killed as r arrives: its request is lost
    h.outbox.clear()
    assert {g: req.job_id for g, req in agent.passes.items()} == {0: "p"}
    assert agent.busy.get(2, agent.busy.get(3)) == "b" and h.state_of("q") == pb.JOB_STATE_QUEUED
    # The new leader loads the store (r first: the first job to want a pass), and
    # runs a round while the agent is still reconnecting.
    stored = {j: (r.job, h.state.extra(j)) for j, r in h.state.jobs.items()}
    h.state = ControllerState(h.state.settings)
    for job_id in ("r", "q", "p", "a", "b"):
        h.state.restore(*stored[job_id], h.now)
    agent.up = False
    h.tick(1.0)
    h.deliver()  # (to an agent not connected: dropped)
    agent.up = True
    h.feed(agent.register_event(h.now))
    h.deliver()
    _books_agree_with(h, agent)
    for _ in range(3):  # and no round sends a job onto p's GPU while its pass runs
        h.tick()
        h.deliver()
        _books_agree_with(h, agent)
    h.finish_profiles()
    h.deliver()
    _books_agree_with(h, agent)


def test_a_pass_the_agent_reports_on_registering_is_not_requested_again():
    """The stream broke; the pass ended meanwhile and its report comes right behind
    the Register, which lists it (`NodeAgent._register_message`). Asked for it again,
    the agent would start a second pass of the job on that GPU, and the first one's
    report, taken for the second's, would free the GPU in the books while the second
    ran on."""
    h = Harness({"rtx-0": ("rtx", 4)})
    agent = h.agents["rtx-0"]
    agent.hold_profiles = True
    h.submit("p")
    h.deliver()
    (g,) = agent.passes
    report = h._profiled(agent, g)  # the pass ends while the stream is down
    # Listed until its report is sent; the controller's request, if any, reaches the
    # agent after that report has reached the controller.
    registered = dataclasses.replace(agent.register_event(h.now), profiling=(("p", 0, g),))
    h.feed(registered)
    for reply in report:
        h.feed(AgentMessage(h.now, agent.name, reply))
    h.deliver()
    _books_agree_with(h, agent)
    assert h.state_of("p") == pb.JOB_STATE_QUEUED and not h.state.nodes["rtx-0"].holder

OPS = ["submit", "tick", "early-tick", "complete", "cancel", "delete", "kill", "lose",
       "drain", "undrain", "hold-profiles", "finish-profiles", "partial-deliver"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=5, max_size=30))
def test_random_event_sequences_keep_the_books(script):
    """Any order of submits, rounds, completions, cancels, deletes, agent deaths and
    losses, drains and profiling results: no RUN lands on a busy GPU (the agents
    assert it), `check_invariants` holds after every event, and once every job has
    ended and every message is delivered, no GPU is held by anyone."""
    h = Harness(NODES)
    n = 0
    names = sorted(h.agents)
    for op, k in script:
        agent = h.agents[names[k % len(names)]]
        deliver = True
        if op == "submit":
            h.submit(f"j{n}", application=["cifar10", "bert"][k % 2])
            n += 1
        elif op == "tick":
            h.tick()
        elif op == "complete":
            running = sorted(j for j, r in h.state.jobs.items()
                             if r.state == pb.JOB_STATE_RUNNING and r.held and not r.moving)
            if running:
                job = running[k % len(running)]
                if any(job in a.running and a.running[job][2] == 0 for a in h.agents.values()):
                    h.complete(job)
        elif op == "cancel" and n:
            h.feed(JobCancelRequested(h.now, f"j{k % n}"))
        elif op == "delete" and n:
            rec = h.state.jobs.get(f"j{k % n}")
            if rec is not None and rec.state in TERMINAL_STATES:
                h.feed(JobDeleted(h.now, rec.job_id))
        elif op == "early-tick":
            h.tick(2.0, trigger="arrival")
        elif op == "kill":  # the agent process dies with its workers, or comes back
            agent.up = not agent.up
            if agent.up:
                h.feed(agent.register_event(h.now))
            else:
                agent.running.clear()
                agent.busy.clear()
                agent.passes.clear()
        elif op == "lose":  # silent past the heartbeat timeout (its workers go on)
            agent.up = False
            h.now += h.state.settings.heartbeat_timeout + 1
            h.heartbeat()
            h.feed(Liveness(h.now))
        elif op in ("drain", "undrain"):
            h.feed(NodeDrainChanged(h.now, agent.name, "test" if op == "drain" else None))
        elif op == "hold-profiles":
            agent.hold_profiles = not agent.hold_profiles
        elif op == "finish-profiles":
            h.finish_profiles()
        elif op == "partial-deliver":  # some messages now, the rest later
            for _ in range(k):
                if h.outbox:
                    _deliver_one(h)
            deliver = False
        if deliver:
            h.deliver()  # FakeAgent asserts no RUN lands on a busy GPU
    # Everything ends: agents back, passes answered, every job cancelled.
    for agent in h.agents.values():
        agent.hold_profiles = False
        if not agent.up:
            agent.up = True
            h.feed(agent.register_event(h.now))
    h.deliver()
    h.finish_profiles()
    for job_id in list(h.state.jobs):
        h.feed(JobCancelRequested(h.now, job_id))
    h.deliver()
    h.assert_no_gpu_held()


def _deliver_one(h: Harness) -> None:
    send = h.outbox.pop(0)
    agent = h.agents[send.node_id]
    if agent.up:
        for reply in h._answer(agent, send.message):
            h.feed(AgentMessage(h.now, agent.name, reply))


def test_round_is_acknowledged_only_after_every_directive_it_caused():
    from sia_grpc.controller.machine.state import RoundAcked, SolveFinished

    h = Harness({"rtx-0": ("rtx", 8)})
    h.submit("j1")
    h.deliver()
    h.now += 60
    h.heartbeat()
    (solve,) = [a for a in h.state.handle(Tick(h.now)) if isinstance(a, Solve)]
    result = h.policy.optimize(solve.cluster, list(solve.jobs), dict(solve.previous))
    actions = h.state.handle(SolveFinished(h.now, solve.round_no, result))
    runs = [a for a in actions if isinstance(a, Send)]
    assert runs and not any(isinstance(a, RoundAcked) for a in actions)
    acked = []
    for send in runs:
        for reply in h._answer(h.agents[send.node_id], send.message):
            acked += h.state.handle(AgentMessage(h.now, send.node_id, reply))
    assert [a.round_no for a in acked if isinstance(a, RoundAcked)] == [solve.round_no]


def test_measured_restart_cost_replaces_the_hint_and_bad_samples_are_dropped():
    h = Harness(NODES)
    rec = h.run("j1")
    node = next(g.node for g in rec.alloc.gpus)
    hint = rec.res.restart_cost
    fitted = rec.estimator.version
    t = pb.Telemetry(job_id="j1", generation=rec.generation, progress=0.1,
                     checkpoint=pb.CheckpointEvent(generation=rec.generation, progress=0.1,
                                                   save_s=2.0, restore_s=hint + 40.0))
    t.samples.add(gpu_type="rtx", num_nodes=1, num_replicas=1, atomic_batch_size=64,
                  step_time_s=0.5, sync_time_s=0.5)  # sync == step: clamped, not a crash
    t.samples.add(gpu_type="rtx", num_nodes=2, num_replicas=1, atomic_batch_size=64,
                  step_time_s=0.5)  # fewer replicas than nodes: dropped
    t.samples.add(gpu_type="rtx", num_nodes=1, num_replicas=1, atomic_batch_size=0,
                  step_time_s=0.5)  # no batch: dropped
    h.feed(AgentMessage(h.now, node, pb.AgentMessage(telemetry=t)))
    assert rec.restart_s() == pytest.approx(hint + 42.0)
    assert rec.estimator.version == fitted + 1
    (solve,) = [a for a in h.state.handle(Tick(h.now)) if isinstance(a, Solve)]
    (pj,) = [j for j in solve.jobs if j.job_id == "j1"]
    assert pj.restart_cost == pytest.approx(hint + 42.0)
    # It survives a controller restart with the rest of the job's state.
    extra = json.loads(h.state.extra("j1"))
    assert extra["restart_cost"] == pytest.approx(hint + 42.0)


def test_a_full_cluster_makes_room_for_a_new_jobs_profiling_pass():
    """No idle GPU to profile on: the next timer round shrinks someone for a slot."""
    h = Harness({"rtx-0": ("rtx", 4), "aws-0": ("aws", 4)})
    for k in range(3):
        h.submit(f"j{k}")
        h.deliver()
    for _ in range(8):
        h.tick()
        h.deliver()
    assert all(len(n.holder) == n.num_gpus for n in h.state.nodes.values())
    h.submit("new")
    h.deliver()
    assert h.state_of("new") == pb.JOB_STATE_PROFILING and not h.state.jobs["new"].profiled
    h.tick()
    h.deliver()
    assert h.state.jobs["new"].profiled == {"rtx", "aws"}
    assert h.state_of("new") in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING)
    h.tick(5.0, "arrival")  # the early round its profile asked for
    h.deliver()
    assert h.state_of("new") == pb.JOB_STATE_RUNNING


def test_a_failed_solve_keeps_the_previous_allocation_and_says_so():
    from sia_grpc.controller.machine.state import RoundDone, SolveFinished

    h = Harness(NODES)
    h.submit("j1")
    h.deliver()
    h.tick()
    h.deliver()
    before = h.state.jobs["j1"].alloc
    h.submit("j2")
    h.deliver()
    h.now += 60
    h.heartbeat()
    (solve,) = [a for a in h.state.handle(Tick(h.now)) if isinstance(a, Solve)]
    actions = h.state.handle(SolveFinished(h.now, solve.round_no, None,
                                           error="solve timed out after 45 s"))
    (done,) = [a for a in actions if isinstance(a, RoundDone)]
    assert "timed out" in done.round.note
    assert not [a for a in actions if isinstance(a, Send)]
    assert h.state.jobs["j1"].alloc == before and h.state.jobs["j2"].alloc is None
    assert h.state.solving is None  # the next round may run
    h.tick()
    h.deliver()
    assert h.state_of("j2") == pb.JOB_STATE_RUNNING


def test_metric_views_count_nodes_capacity_and_the_longest_wait():
    h = Harness({"rtx-0": ("rtx", 4), "rtx-1": ("rtx", 4), "aws-0": ("aws", 2)},
                policy="fifo")
    rigid = dict(adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=4, batch_size=512)
    h.submit("first", **rigid)
    assert h.state.queue_max_wait(h.now + 7.0) == pytest.approx(7.0)  # profiling, never run
    h.now += 10.0
    h.submit("second", **rigid)
    h.deliver()
    h.tick()  # both run, on the two rtx nodes
    h.deliver()
    assert h.state.queue_max_wait(h.now) == 0.0  # started jobs are not waiting
    h.now += 5.0
    h.submit("third", **rigid)
    h.deliver()
    assert h.state_of("third") == pb.JOB_STATE_QUEUED
    assert h.state.queue_max_wait(h.now + 3.0) == pytest.approx(3.0)
    assert h.state.gpus_capacity() == {"rtx": 8, "aws": 2}
    assert h.state.gpus_allocated() == {"rtx": 8, "aws": 0}
    assert h.state.nodes_by_state() == {"READY": 3}

    h.feed(NodeDrainChanged(h.now, "aws-0", "maintenance"))
    h.agents["rtx-1"].up = False
    h.tick(31.0)  # rtx-1 misses its heartbeats
    assert h.state.nodes_by_state() == {"READY": 1, "DRAINING": 1, "LOST": 1}
    # Only ready nodes are capacity; a type with none left stays, at 0.
    assert h.state.gpus_capacity() == {"rtx": 4, "aws": 0}


def test_job_states_change_only_along_the_transition_table():
    from sia_grpc.controller.machine.transitions import TRANSITIONS, IllegalTransition, set_state

    h = Harness({"rtx-0": ("rtx", 4)})
    h.submit("j1")
    rec = h.state.jobs["j1"]
    h.feed(JobCancelRequested(h.now, "j1"))
    assert rec.state == pb.JOB_STATE_CANCELLED and not TRANSITIONS[pb.JOB_STATE_CANCELLED]
    with pytest.raises(IllegalTransition, match=r"j1: CANCELLED -> RUNNING \('running'\)"):
        set_state(rec, pb.JOB_STATE_RUNNING, h.now, "running")


def test_a_stored_record_from_a_newer_controller_is_refused_and_an_older_one_read():
    h = Harness({"rtx-0": ("rtx", 4)})
    h.submit("j1")
    h.deliver()
    job = h.state.jobs["j1"].job
    extra = json.loads(h.state.extra("j1"))
    assert extra["v"] == 2
    fresh = ControllerState(h.state.settings)
    with pytest.raises(ValueError, match="'j1': its stored state has format 3, newer than"):
        fresh.restore(job, json.dumps({**extra, "v": 3}).encode(), h.now)
    del extra["v"], extra["held_gen"]  # what a controller before versions wrote
    fresh.restore(job, json.dumps(extra).encode(), h.now)
    assert fresh.jobs["j1"].usable == h.state.jobs["j1"].usable


def test_telemetry_sets_the_jobs_throughput_and_a_restart_its_measured_cost():
    h = Harness(NODES)
    rec = h.run("j1")
    status = rec.job.status
    # The agents report 0.2 s steps, 0.05 s of them syncing (harness.FakeAgent).
    a = status.allocation
    per_iteration = a.num_replicas * a.atomic_batch_size * (a.accum_steps + 1)
    assert status.throughput == pytest.approx(per_iteration / (0.2 + 0.15 * a.accum_steps))
    assert status.restart_seconds == 0 and status.restarts == 0
    for _ in range(6):  # it grows (test_a_job_that_grows_is_stopped_before_it_runs_again)
        h.tick()
        if h.state_of("j1") == pb.JOB_STATE_RESTARTING:
            break
        h.deliver()
    assert h.state_of("j1") == pb.JOB_STATE_RESTARTING and status.restarts == 1
    assert status.throughput == 0  # checkpointing: not training
    began = h.now
    # A controller that takes over meanwhile goes on measuring it.
    assert json.loads(h.state.extra("j1"))["restart_began"] == [began, rec.generation]
    h.persisted.clear()
    h.now += 7.0  # the checkpoint, the release and the start at the new allocation
    h.deliver()  # (the new generation's first telemetry comes with its RUN's ack)
    assert h.state_of("j1") == pb.JOB_STATE_RUNNING and rec.generation == 2
    assert status.restart_seconds == pytest.approx(7.0)
    assert status.throughput > 0 and "j1" in h.persisted
    # Later reports change the throughput, not the cost of the restart.
    h.now += 30.0
    node = next(g.node for g in rec.alloc.gpus)
    t = pb.Telemetry(job_id="j1", generation=rec.generation, progress=0.2)
    t.samples.add(gpu_type="rtx", num_nodes=1, num_replicas=2, atomic_batch_size=32,
                  accum_steps=1, step_time_s=0.5, sync_time_s=0.1)
    h.feed(AgentMessage(h.now, node, pb.AgentMessage(telemetry=t)))
    assert status.throughput == pytest.approx(2 * 32 * 2 / (0.5 + 0.4))
    assert status.restart_seconds == pytest.approx(7.0)
    assert json.loads(h.state.extra("j1"))["restart_began"] is None


class _CountingJobs(dict):
    """The state's jobs, counting lookups (how many records an event looks at)."""

    looked = 0

    def get(self, key, default=None):
        self.looked += 1
        return super().get(key, default)


def _every_job_moves_on(h: Harness, n: int) -> tuple[list[JobRec], dict]:
    """n one-GPU jobs j00.. running on h's n one-GPU nodes, then a round (answered by
    the test) that moves each to the next node: the jobs' records and the moves, with
    the STOPs sent and not yet answered."""
    for k in range(n):
        h.submit(f"j{k:02}", max_gpus=1)
    h.deliver()
    h.tick()
    h.deliver()
    recs = [h.state.jobs[f"j{k:02}"] for k in range(n)]
    assert all(r.state == pb.JOB_STATE_RUNNING for r in recs)
    h.state.handle(Tick(h.now, "timer"))
    nodes = [r.alloc.gpus[0].node for r in recs]
    moves = {r.job_id: dataclasses.replace(r.alloc, gpus=(GpuId(nodes[(k + 1) % n], 0),))
             for k, r in enumerate(recs)}
    h.feed(SolveFinished(h.now, h.state.solving, RoundResult(
        allocations=moves, restarted=frozenset(moves), objective=0.0, timings={},
        reasons=dict.fromkeys(moves, "running"))))
    return recs, moves


def test_a_freed_gpu_wakes_only_the_moves_waiting_on_its_node():
    """Regression (issue 17, profiled at 1,000 agents): every freed GPU made the next
    event re-examine every moving job, so a round moving hundreds of jobs cost moves x
    acks. Now a STOP's ack looks at the moves waiting on that node alone; all still
    start, each on the GPU the round gave it."""
    n = 30
    h = Harness({f"n{k:02}": ("rtx", 1) for k in range(n)})
    recs, moves = _every_job_moves_on(h, n)
    assert all(r.moving and r.held for r in recs)  # each waits for a STOP's ack
    h.state.job_book.jobs = jobs = _CountingJobs(h.state.job_book.jobs)
    h.check = lambda: None  # (the invariant check looks at every record: once, below)
    h.deliver()  # n acks, each freeing one node
    h.state.check_invariants()
    assert all(r.state == pb.JOB_STATE_RUNNING for r in recs)
    assert {r.job_id: r.alloc.gpus for r in recs} == {j: a.gpus for j, a in moves.items()}
    assert jobs.looked < 8 * n, jobs.looked  # a scan of every move per ack: ~n * n


def test_a_stops_exit_inside_its_ack_is_read_as_the_exit_then_the_ack():
    """`DirectiveAck.exit` (agents told `Registered.acks_carry_exits`): a round that moves
    every job leaves the same books whether each STOP's checkpoint comes as a JobExit
    before its ack or inside it: every job RUNNING on its new GPU, its checkpoint
    recorded, the old GPU free, the invariants kept."""
    def moved(carry: bool) -> list[tuple]:
        n = 6
        h = Harness({f"n{k:02}": ("rtx", 1) for k in range(n)}, acks_carry_exits=carry)
        recs, _ = _every_job_moves_on(h, n)
        h.deliver()
        h.state.check_invariants()
        assert not h.state.directive_book.pending
        return [(r.job_id, r.state, r.generation, r.checkpoint, r.alloc.gpus, dict(r.held),
                 r.job.status.restarts) for r in recs] + sorted(
            (name, dict(node.holder)) for name, node in h.state.nodes.items())

    apart, inside = moved(False), moved(True)
    assert inside == apart
    assert all(row[1] == pb.JOB_STATE_RUNNING and row[3] == 0.5 for row in apart[:6])


def test_a_records_samples_are_encoded_again_only_when_they_change():
    """Issue 17: JSON-encoding every record's samples on every write was 15 s of a
    79 s profile of five rounds at 1,000 agents, mostly for writes that changed only
    the status. The samples are kept encoded until the estimator has new data."""
    h = Harness(NODES)
    rec = h.run("j1")
    node = next(g.node for g in rec.alloc.gpus)
    first = h.state.extra("j1")
    encoded = rec.samples_json[1]
    rec.job.status.progress = 0.5  # a status change: the samples are not encoded again
    h.state.extra("j1")
    assert rec.samples_json[1] is encoded
    t = pb.Telemetry(job_id="j1", generation=rec.generation, progress=0.2)
    t.samples.add(gpu_type="rtx", num_nodes=1, num_replicas=3, atomic_batch_size=48,
                  step_time_s=0.7, sync_time_s=0.1)
    h.feed(AgentMessage(h.now, node, pb.AgentMessage(telemetry=t)))  # a new shape
    extra = h.state.extra("j1")
    assert ["rtx", 1, 3, 48, 0, 0.7, 0.1] in json.loads(extra)["samples"]
    assert json.loads(extra)["samples"][:-1] == json.loads(first)["samples"]
    # The same bytes as encoding the whole at once; read back, the same record.
    assert extra == json.dumps(json.loads(extra), separators=(",", ":")).encode()
    back = JobRec(job=rec.job, res=rec.res)
    load_extra(back, json.loads(extra))
    assert back.samples == rec.samples and back.held == rec.held
    assert back.estimator.version == len(rec.samples)
    # The same shape again, its step time moved by more than 5 %: its row alone is
    # encoded again (each row is kept encoded), and the bytes stay the whole's.
    t.samples[0].step_time_s = 0.9
    h.feed(AgentMessage(h.now, node, pb.AgentMessage(telemetry=t)))
    extra = h.state.extra("j1")
    assert json.loads(extra)["samples"][-1] == ["rtx", 1, 3, 48, 0, 0.9, 0.1]
    assert len(json.loads(extra)["samples"]) == len(rec.samples)
    assert extra == json.dumps(json.loads(extra), separators=(",", ":")).encode()


def _profiles(h: Harness) -> list[Send]:
    return [s for s in h.outbox if s.message.WhichOneof("kind") == "profile"]


def test_an_identical_job_reuses_the_profiles_and_is_schedulable_at_once():
    """Same application, command and batch limits: no pass, the first job's samples."""
    h = Harness(NODES)
    h.submit("j1", command=["python", "train.py"])
    h.deliver()
    first = h.state.jobs["j1"]
    assert first.usable == {"aws", "rtx"}
    h.outbox.clear()
    h.submit("j2", command=["python", "train.py"])
    rec = h.state.jobs["j2"]
    assert not _profiles(h) and h.state_of("j2") == pb.JOB_STATE_QUEUED
    assert "reused from an identical job" in rec.job.status.reason
    assert rec.usable == rec.profiled == {"aws", "rtx"} and rec.grad == first.grad
    assert {k: v for k, v in rec.samples.items()} == \
        {k: v for k, v in first.samples.items() if k[1:3] == (1, 1)}
    assert "j2" not in h.state.profile_book.to_profile and "j2" in h.persisted
    h.tick(5.0, "arrival")  # GPUs are idle: it runs at the next (early) round
    h.deliver()
    assert h.state_of("j2") == pb.JOB_STATE_RUNNING


@pytest.mark.parametrize("other", [{"command": ["python", "other.py"]},
                                   {"application": "bert"}, {"pipeline_gpus": 2}])
def test_a_different_program_is_profiled_afresh(other):
    h = Harness(NODES)
    h.submit("j1", command=["python", "train.py"])
    h.deliver()
    h.outbox.clear()
    spec = {"command": ["python", "train.py"], **other}
    h.submit("j2", spec.pop("application", "cifar10"), **spec)
    assert h.state_of("j2") == pb.JOB_STATE_PROFILING and _profiles(h)


def test_profiles_are_not_reused_when_the_setting_is_off():
    h = Harness(NODES, settings=ControllerSettings(heartbeat_timeout=30.0,
                                                   reuse_profiles=False))
    h.submit("j1", command=["train"])
    h.deliver()
    h.outbox.clear()
    h.submit("j2", command=["train"])
    assert h.state_of("j2") == pb.JOB_STATE_PROFILING and len(_profiles(h)) == 2


def test_a_type_no_identical_job_profiled_still_gets_a_pass():
    h = Harness(NODES)
    h.submit("j1", command=["train"], allowed_gpu_types=["rtx"])
    h.deliver()
    h.outbox.clear()
    h.submit("j2", command=["train"])
    rec = h.state.jobs["j2"]
    assert h.state_of("j2") == pb.JOB_STATE_QUEUED and rec.usable == {"rtx"}
    assert [h.agents[s.node_id].gpu_type for s in _profiles(h)] == ["aws"]
    h.deliver()
    assert rec.usable == {"aws", "rtx"} and "j2" not in h.state.profile_book.to_profile


def test_profiles_restored_from_the_store_are_reused_after_a_restart():
    h = Harness(NODES)
    h.submit("j1", command=["train"])
    h.deliver()
    rec = h.state.jobs["j1"]
    fresh = Harness(NODES)
    fresh.state.restore(pb.Job.FromString(rec.job.SerializeToString()), h.state.extra("j1"),
                        fresh.now)
    fresh.outbox.clear()
    fresh.submit("j2", command=["train"])
    assert fresh.state_of("j2") == pb.JOB_STATE_QUEUED and not _profiles(fresh)
    assert fresh.state.jobs["j2"].usable == {"aws", "rtx"}


def test_the_profile_cache_keeps_its_bound():
    h = Harness({"rtx-0": ("rtx", 8)}, settings=ControllerSettings(
        heartbeat_timeout=30.0, profile_cache_entries=2))
    for k in range(4):
        h.submit(f"j{k}", command=[f"train-{k}"])
        h.deliver()
    assert len(h.state.profile_book.cache) == 2
    h.outbox.clear()
    h.submit("again", command=["train-0"])  # the oldest: dropped
    assert h.state_of("again") == pb.JOB_STATE_PROFILING


def _ports(h: Harness, job_id: str) -> set[tuple[str, int]]:
    return {(s.node_id, s.message.directive.world.master_port) for s in h.outbox
            if s.message.WhichOneof("kind") == "directive"
            and s.message.directive.job_id == job_id
            and s.message.directive.action == pb.Directive.ACTION_RUN}


def test_two_jobs_whose_ports_hash_alike_rendezvous_at_different_ports():
    """`ja/1` and `jb1022/1` hash to one port: the second is moved on past it (the rule
    the invariant check holds: no two live generations share a master's port)."""
    h = Harness({"rtx-0": ("rtx", 8)})
    for job_id in ("ja", "jb1022"):
        h.submit(job_id, max_gpus=2)
        h.deliver()
    h.tick()
    ((_, a),), ((_, b),) = _ports(h, "ja"), _ports(h, "jb1022")
    assert a != b and abs(a - b) == 1
    h.deliver()
    assert {h.state_of(j) for j in ("ja", "jb1022")} == {pb.JOB_STATE_RUNNING}
    h.complete("ja")
    h.deliver()
    # ja's port is free again once its workers are gone: a later generation may take it.
    rec = h.state.jobs["ja"]
    assert rec.rendezvous is not None and live_rendezvous(rec) is None


def test_a_job_whose_workers_fail_is_retried_from_its_checkpoint_then_failed():
    """`job_retries` (2) requeues: a start-up error on one node (a port taken) does not
    end the run; the third failure does, with the workers' message."""
    h = Harness(NODES)
    rec = h.run("j1")
    for retry in (1, 2):
        gen = rec.generation
        h.complete("j1", pb.JobExit.KIND_FAILED, "EADDRINUSE: address already in use\nlog")
        assert h.state_of("j1") == pb.JOB_STATE_QUEUED and rec.failures == retry
        assert rec.job.status.reason.startswith("requeued: its workers failed on ")
        assert f"(retry {retry} of 2): EADDRINUSE: address already in use" in \
            rec.job.status.reason and not rec.job.status.message
        assert rec.generation == gen + 1  # the failed generation is fenced
        h.deliver()
        h.tick()
        h.deliver()
        assert h.state_of("j1") == pb.JOB_STATE_RUNNING and rec.generation > gen + 1
    again = ControllerState(h.state.settings)
    again.restore(pb.Job.FromString(rec.job.SerializeToString()), h.state.extra("j1"), h.now)
    assert again.jobs["j1"].failures == 2  # the count survives a restart
    h.complete("j1", pb.JobExit.KIND_FAILED, "Traceback: boom")
    assert h.state_of("j1") == pb.JOB_STATE_FAILED
    assert rec.job.status.message == "Traceback: boom"
    assert rec.job.status.reason == "failed: Traceback: boom (after 2 retries)"
    h.deliver()
    h.assert_no_gpu_held()


def test_without_retries_the_first_failure_fails_the_job():
    h = Harness(NODES, settings=ControllerSettings(heartbeat_timeout=30.0, job_retries=0))
    h.run("j1")
    h.complete("j1", pb.JobExit.KIND_FAILED, "boom")
    assert h.state_of("j1") == pb.JOB_STATE_FAILED
    assert h.state.jobs["j1"].job.status.reason == "failed: boom"


def test_identical_jobs_submitted_together_share_one_pass_per_type():
    """A sweep arriving at once: the first job's passes run, the others wait for
    them and take their result (no GPU of their own, no pass of their own)."""
    h = Harness(NODES)
    for a in h.agents.values():
        a.hold_profiles = True
    for k in range(4):
        h.submit(f"s{k}", command=["sweep"])
    assert sorted(s.message.profile.job_id for s in _profiles(h)) == ["s0", "s0"]
    assert all(h.state_of(f"s{k}") == pb.JOB_STATE_PROFILING for k in range(4))
    h.deliver()  # the agents hold the passes
    h.finish_profiles()
    assert not _profiles(h)
    for k in range(4):
        rec = h.state.jobs[f"s{k}"]
        assert h.state_of(f"s{k}") == pb.JOB_STATE_QUEUED and rec.usable == {"aws", "rtx"}
    assert "reused from an identical job" in h.state.jobs["s3"].job.status.reason


def test_when_the_shared_pass_is_refused_the_waiting_jobs_profile_themselves():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.agents["rtx-0"].hold_profiles = True
    h.submit("s0", command=["sweep"])
    h.submit("s1", command=["sweep"])
    ((node, p),) = [(s.node_id, s.message.profile) for s in _profiles(h)]
    assert p.job_id == "s0"
    h.deliver()
    h.agents["rtx-0"].passes.pop(p.local_gpu)
    h.feed(AgentMessage(h.now, node, refused_pass(p)))
    # s1 no longer waits: it takes the GPU for a pass of its own, and s0 (whose pass
    # never ran) waits for that one instead of profiling again beside it.
    assert [s.message.profile.job_id for s in _profiles(h)] == ["s1"]
    h.deliver()
    h.finish_profiles()
    assert {h.state_of("s0"), h.state_of("s1")} == {pb.JOB_STATE_QUEUED}


def test_a_job_waiting_for_a_cancelled_jobs_pass_profiles_itself():
    h = Harness({"rtx-0": ("rtx", 8)})
    h.agents["rtx-0"].hold_profiles = True
    h.submit("s0", command=["sweep"])
    h.submit("s1", command=["sweep"])
    h.deliver()
    h.outbox.clear()
    h.feed(JobCancelRequested(h.now, "s0"))
    assert [s.message.profile.job_id for s in _profiles(h)] == ["s1"]
    h.deliver()
    h.finish_profiles()
    h.deliver()
    assert h.state_of("s1") == pb.JOB_STATE_QUEUED and not h.state.profile_book.pass_waiters


def test_a_waiting_job_whose_fenced_workers_are_on_a_drained_node_just_waits():
    """Found by the 20× chaos run: a job requeued when its node was lost, the node
    back still running the old generation (fenced: booked until its STOP's ack),
    then drained. The job waits; it was taken for a running one and checkpointed
    (QUEUED -> RESTARTING, an illegal transition)."""
    h = Harness({"rtx-0": ("rtx", 8)}, policy="gavel")
    h.submit("j1", adaptivity=pb.ADAPTIVITY_RIGID, num_gpus=2, batch_size=256)
    h.deliver()
    h.tick()
    h.deliver()
    agent = h.agents["rtx-0"]
    old = agent.running["j1"]
    agent.up = False
    h.tick(31.0)  # lost: requeued
    assert h.state_of("j1") == pb.JOB_STATE_QUEUED
    agent.up = True
    agent.running["j1"] = old  # its workers ran on all along
    h.feed(agent.register_event(h.now))
    rec = h.state.jobs["j1"]
    assert rec.held and rec.stopping == {"rtx-0"} and not rec.moving
    h.feed(NodeDrainChanged(h.now, "rtx-0", "maintenance"))
    h.tick()
    assert h.state_of("j1") == pb.JOB_STATE_QUEUED
    h.deliver()  # the STOP's ack frees the GPUs
    assert not rec.held


def test_a_round_waiting_on_an_agent_that_disconnects_finishes_then_interrupted():
    """Issue 37, item 2: a round whose RUN went to an agent that then died waited for
    that agent's acknowledgement until the heartbeat timeout made its node LOST, and
    was published late, after later rounds, with a length no round had. The rule: a
    round is finished when every directive it sent is acknowledged or its agent is
    gone; then at once, noted interrupted (the directive stays pending and is sent
    again if the agent comes back)."""
    h = Harness({"n0": ("rtx", 4)})
    h.submit("j1", max_gpus=4)
    h.deliver()
    h.tick()  # the round sends j1's RUN to n0; n0 never answers
    (round_no,) = {s.message.directive.round for s in h.outbox if s.node_id == "n0"
                   and s.message.HasField("directive")}
    actions = h.feed(AgentDisconnected(h.now + 1, "n0"))
    (acked,) = [a for a in actions if isinstance(a, RoundAcked)]
    assert acked.round_no == round_no
    assert acked.interrupted.startswith("interrupted: n0 disconnected before acknowledging 1")
    assert h.state.directive_book.pending  # sent again when it reconnects
    h.outbox.clear()
    h.feed(h.agents["n0"].register_event(h.now + 2))
    assert any(s.message.HasField("directive") for s in h.outbox)  # the RUN, again
