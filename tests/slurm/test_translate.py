"""The bridge's translation, from Slurm 22.05 JSON recorded on the test cluster
(tests/slurm/data: `sinfo --json` and `squeue --json` with node a100-0 drained,
Slurm's own job 3 running on 2 GPUs of rtx-0, sia jobs 4 and 5 running on the other
2, sia job 6 held waiting for Sia, Slurm's own job 7 pending, jobs 1 and 2 cancelled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sia_grpc.api import pb
from sia_grpc.cli import main as sia
from sia_grpc.slurm.ticket import env_exports
from sia_grpc.slurm.translate import (
    Shape,
    Ticket,
    build_round,
    job_environment,
    plan,
    read_jobs,
    read_nodes,
)

DATA = Path(__file__).parent / "data"
SINFO = json.loads((DATA / "sinfo.json").read_text())
SQUEUE = json.loads((DATA / "squeue.json").read_text())
NOW = 1796146600.0
SPEC = {"application": "cifar10", "adaptivity": "adaptive", "max_gpus": 4}


def test_nodes_map_gres_types_onto_profile_types_and_leave_drained_ones_out():
    nodes, left_out = read_nodes(SINFO)
    assert [(n.name, n.gres_type, n.gpu_type, n.num_gpus) for n in nodes] == [
        ("rtx-0", "rtx", "rtx", 4), ("rtx-1", "rtx", "rtx", 4)]
    assert list(left_out) == ["a100-0"] and "DRAIN" in left_out["a100-0"]
    undrained = {"nodes": [{**n, "state_flags": []} for n in SINFO["nodes"]]}
    a100 = [n for n in read_nodes(undrained)[0] if n.name == "a100-0"]
    assert [(n.gres_type, n.gpu_type) for n in a100] == [("a100", "dgx-ext")]


def test_nodes_with_untyped_or_mixed_gpus_are_left_out_saying_why():
    base = SINFO["nodes"][1]
    sinfo = {"nodes": [{**base, "name": "u", "gres": "gpu:4"},
                       {**base, "name": "m", "gres": "gpu:rtx:2,gpu:a100:2(S:0)"},
                       {**base, "name": "ok", "gres": "gpu:a100:8(S:0-1)"}]}
    nodes, left_out = read_nodes(sinfo)
    assert [(n.name, n.gpu_type, n.num_gpus) for n in nodes] == [("ok", "dgx-ext", 8)]
    assert set(left_out) == {"u", "m"} and "gpu:TYPE:COUNT" in left_out["m"]


def test_jobs_are_read_with_their_tickets_and_the_gpus_they_hold():
    jobs = {j.job_id: j for j in read_jobs(SQUEUE)}
    assert sorted(jobs) == [3, 4, 5, 6, 7]  # 1 and 2 are cancelled
    assert jobs[3].ticket is None and dict(jobs[3].gpus) == {"rtx-0": 2}
    assert jobs[7].ticket is None and not jobs[7].gpus and not jobs[7].held
    for j in (jobs[4], jobs[5]):
        assert j.ticket.shape.gpu_type == "rtx" and dict(j.gpus) == {"rtx-0": 1}
    assert jobs[4].ticket.id == "1" and jobs[4].ticket.moves == 1
    assert jobs[6].held and jobs[6].ticket.shape is None and jobs[6].ticket.id == "6"


def test_a_job_on_several_nodes_holds_the_gpus_of_each():
    job = {"job_id": 9, "job_state": "RUNNING", "priority": 1, "comment": "",
           "gres_detail": ["gpu:rtx:4(IDX:0-3)", "gpu:2(IDX:1,3)"],
           "job_resources": {"allocated_nodes": [{"nodename": "rtx-0"}, {"nodename": "rtx-1"}]}}
    (j,) = read_jobs({"jobs": [job]})
    assert dict(j.gpus) == {"rtx-0": 4, "rtx-1": 2}


def test_comments_that_are_not_tickets_are_slurms_own_jobs():
    assert Ticket.parse("", 1) is None
    assert Ticket.parse("my run", 1) is None
    assert Ticket.parse("sia1:{not json", 1) is None
    assert Ticket.parse('sia1:{"id":"x"}', 1) is None  # no spec
    t = Ticket("7", SPEC, NOW, 2, Shape("dgx-ext", "a100", 4, 1, 512, 128, 0, 4))
    assert Ticket.parse(t.comment(), 99) == t
    assert Ticket.parse(replace(t, id="").comment(), 99).id == "99"


def test_the_round_offers_sia_what_slurms_own_jobs_leave_and_keeps_running_jobs_in_place():
    nodes, left_out = read_nodes(SINFO)
    rnd = build_round(nodes, read_jobs(SQUEUE), NOW, left_out=left_out)
    req = rnd.request
    assert [(n.name, n.gpu_type, n.num_gpus) for n in req.nodes] == [
        ("rtx-0", "rtx", 2), ("rtx-1", "rtx", 4)]  # job 3 holds 2 of rtx-0's 4
    assert [j.job_id for j in req.jobs] == ["1", "2", "6"]
    assert all(j.samples and j.init_batch_size for j in req.jobs)  # the seed profiles
    assert {p.job_id: (p.allocation.gpu_type, p.allocation.num_gpus,
                       sorted((g.node, g.index) for g in p.allocation.gpus))
            for p in req.previous} == {"1": ("rtx", 1, [("rtx-0", 0)]),
                                       "2": ("rtx", 1, [("rtx-0", 1)])}
    assert req.jobs[0].restarts == 1 and req.jobs[2].restarts == 0


def test_a_released_job_slurm_has_not_started_yet_is_placed_where_it_fits():
    nodes, _ = read_nodes(SINFO)
    shape = Shape("rtx", "rtx", 3, 1)
    waiting = read_jobs({"jobs": [{"job_id": 20, "job_state": "PENDING", "priority": 5,
                                   "comment": Ticket("20", SPEC, NOW, 0, shape).comment()}]})
    prev = build_round(nodes, waiting, NOW).request.previous
    assert [(p.allocation.num_gpus, {g.node for g in p.allocation.gpus}) for p in prev] == [
        (3, {"rtx-0"})]
    too_big = [replace(waiting[0], ticket=replace(waiting[0].ticket, shape=replace(
        shape, num_gpus=5)))]
    assert not build_round(nodes, too_big, NOW).request.previous  # Sia plans it anew


def _placed(job_id: str, gpu_type: str, per_node: dict[str, int]) -> pb.JobDecision:
    """A decision naming its GPUs, as the policy's are."""
    gpus = [pb.GpuRef(node=n, index=i) for n, c in per_node.items() for i in range(c)]
    return pb.JobDecision(job_id=job_id, allocation=pb.Allocation(
        gpu_type=gpu_type, num_gpus=len(gpus), num_nodes=len(per_node), gpus=gpus,
        batch_size=256, atomic_batch_size=64))


def test_starts_and_copies_are_pinned_to_sias_nodes_and_pinned_again_if_they_change():
    """Slurm is asked for the nodes Sia placed a job on, not a type and a count
    (left to choose, it started copies on GPUs Sia had planned for others); a job
    not started yet is planned where it is pinned, and pinned anew when Sia's plan
    for it moves it to other nodes of the same shape."""
    nodes, _ = read_nodes(SINFO)
    rnd = build_round(nodes, read_jobs(SQUEUE), NOW)
    actions = {a.job_id: a for a in plan(rnd, pb.OptimizeResponse(decisions=[
        _placed("6", "rtx", {"rtx-1": 3}), _placed("2", "rtx", {"rtx-0": 1, "rtx-1": 1})]))}
    start, move = actions[6], actions[5]
    assert start.kind == "start" and start.ticket.shape.nodes == (("rtx-1", 3),)
    assert move.kind == "move" and move.ticket.shape.nodes == (("rtx-0", 1), ("rtx-1", 1))
    assert move.ticket.shape.num_nodes == 2 and move.ticket.shape.node_names == "rtx-0,rtx-1"
    assert Ticket.parse(move.ticket.comment(), 5) == move.ticket  # (kept in Slurm)
    # Slurm has not started the copy yet: its previous allocation is where it is pinned
    # (rtx-1, though rtx-0 is as free and first: where the bridge guessed Slurm would
    # start it before pinning).
    copy = read_jobs({"jobs": [{"job_id": 21, "job_state": "PENDING", "priority": 5,
                                "comment": replace(start.ticket, id="21").comment()}]})
    (prev,) = build_round(nodes, copy, NOW).request.previous
    assert {g.node for g in prev.allocation.gpus} == {"rtx-1"}
    rnd = build_round(nodes, copy, NOW)
    assert plan(rnd, pb.OptimizeResponse(decisions=[_placed("21", "rtx", {"rtx-1": 3})])) == []
    (pin,) = plan(rnd, pb.OptimizeResponse(decisions=[_placed("21", "rtx", {"rtx-0": 3})]))
    assert pin.kind == "pin" and pin.ticket.shape.nodes == (("rtx-0", 3),)
    assert pin.ticket.moves == start.ticket.moves and pin.ticket.placed == start.ticket.placed
    # Once Slurm runs it, it stays where it runs: a plan naming other nodes of the same
    # shape changes nothing.
    running = read_jobs({"jobs": [{**copy[0].raw, "job_state": "RUNNING",
                                   "gres_detail": ["gpu:rtx:3(IDX:0-2)"],
                                   "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}]})
    rnd = build_round(nodes, running, NOW)
    assert plan(rnd, pb.OptimizeResponse(decisions=[_placed("21", "rtx", {"rtx-0": 3})])) == []
    # A ticket from before pinning (no nodes): planned where Slurm could start it.
    legacy = read_jobs({"jobs": [{**copy[0].raw, "comment": replace(
        start.ticket, id="21", shape=replace(start.ticket.shape, nodes=())).comment()}]})
    (prev,) = build_round(nodes, legacy, NOW).request.previous
    assert {g.node for g in prev.allocation.gpus} == {"rtx-0"}


def test_slurm_is_asked_for_the_pinned_nodes():
    from sia_grpc.slurm.commands import _gpus_request

    shape = Shape("rtx", "rtx", 4, 2, nodes=(("rtx-0", 2), ("rtx-1", 2)))
    assert _gpus_request(shape)[-1] == "ReqNodeList=rtx-0,rtx-1"
    assert not any(f.startswith("ReqNodeList") for f in _gpus_request(replace(shape, nodes=())))


def test_an_unschedulable_spec_is_left_out_of_the_round_with_its_reason():
    bad = Ticket("30", {"application": "nosuchapp", "adaptivity": "adaptive"}, NOW)
    jobs = read_jobs({"jobs": [{"job_id": 30, "job_state": "PENDING", "priority": 0,
                                "state_reason": "JobHeldUser", "comment": bad.comment()}]})
    rnd = build_round(read_nodes(SINFO)[0], jobs, NOW)
    assert not rnd.request.jobs and "application" in rnd.invalid["30"]
    # One that runs already (its spec read differently since) keeps its GPUs, taken.
    running = read_jobs({"jobs": [{"job_id": 31, "job_state": "RUNNING", "priority": 5,
                                   "comment": replace(bad, id="31", shape=Shape(
                                       "rtx", "rtx", 3, 1)).comment(),
                                   "gres_detail": ["gpu:rtx:3(IDX:0-2)"],
                                   "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}]})
    rnd = build_round(read_nodes(SINFO)[0], running, NOW)
    assert "31" in rnd.invalid and {n.name: n.num_gpus for n in rnd.request.nodes}["rtx-1"] == 1


def _decision(job_id: str, gpu_type: str | None = None, gpus: int = 0,
              nodes: int = 1) -> pb.JobDecision:
    d = pb.JobDecision(job_id=job_id, reason="because")
    if gpu_type:
        d.allocation.CopyFrom(pb.Allocation(gpu_type=gpu_type, num_gpus=gpus, num_nodes=nodes,
                                            batch_size=256, atomic_batch_size=64))
    return d


def test_decisions_become_starts_moves_and_batch_changes_in_place():
    sinfo = {"nodes": [{**n, "state_flags": []} for n in SINFO["nodes"]]}  # a100-0 back
    nodes, _ = read_nodes(sinfo)
    rnd = build_round(nodes, read_jobs(SQUEUE), NOW)
    response = pb.OptimizeResponse(decisions=[
        _decision("1", "rtx", 1),  # keeps its place, another batch: rebatched
        _decision("2", "dgx-ext", 2),  # another type: moved
        _decision("6", "dgx-ext", 4)])  # held, waiting: started
    actions = {a.job_id: a for a in plan(rnd, response)}
    assert sorted(actions) == [4, 5, 6]
    rebatch, move, start = actions[4], actions[5], actions[6]
    # Same GPUs, a new batch: written into the ticket, the same generation, nothing
    # restarted (the workers are told in the reply to their next report).
    kept = rnd.jobs["1"].ticket
    assert rebatch.kind == "rebatch" and rebatch.ticket.moves == kept.moves
    assert rebatch.ticket.shape.same_place(kept.shape)
    assert rebatch.ticket.shape.batch == (256, 64, 0) != kept.shape.batch
    assert rebatch.ticket.placed == kept.placed  # (no restart to measure)
    same = pb.JobDecision(job_id="1", allocation=pb.Allocation(
        gpu_type="rtx", num_gpus=1, num_nodes=1, batch_size=kept.shape.batch_size,
        atomic_batch_size=kept.shape.atomic_batch_size, accum_steps=kept.shape.accum_steps))
    assert plan(rnd, pb.OptimizeResponse(decisions=[same])) == []  # nothing to change
    assert move.kind == "move" and move.ticket.id == "2" and move.ticket.moves == 2
    assert (move.ticket.shape.gres_type, move.ticket.shape.num_gpus) == ("a100", 2)
    assert start.kind == "start" and start.ticket.id == "6" and start.ticket.moves == 0
    assert (start.ticket.shape.gpu_type, start.ticket.shape.gres_type,
            start.ticket.shape.num_gpus, start.ticket.shape.batch_size) == (
        "dgx-ext", "a100", 4, 256)
    # Both placed now: what the copy's first report measures a move's cost from.
    assert move.ticket.placed == start.ticket.placed == NOW
    # No GPUs for a running job: moved back to held, waiting, without a shape (its
    # wait for GPUs is no part of a restart's cost).
    (off,) = plan(rnd, pb.OptimizeResponse(decisions=[_decision("1")]))
    assert off.kind == "move" and off.job_id == 4 and off.ticket.shape is None
    assert off.ticket.placed is None
    # No GPUs for a waiting job: nothing to do.
    assert plan(rnd, pb.OptimizeResponse(decisions=[_decision("6")])) == []


def test_a_jobs_progress_and_run_time_go_to_the_policy_and_survive_its_moves():
    """The workers' progress and the time the job has run (its earlier copies', and
    its current copy's since its first report while Slurm runs it) reach the
    policy, so sia-plus can tell a job near its end from one far from it."""
    shape = Shape("rtx", "rtx", 1, 1)
    ticket = Ticket("50", SPEC, NOW - 7200, 1, shape, progress=0.4, ran=1000.0,
                    running_since=NOW - 500)
    assert Ticket.parse(ticket.comment(), 50) == ticket
    running = {"job_id": 50, "job_state": "RUNNING", "priority": 5, "comment": ticket.comment(),
               "gres_detail": ["gpu:rtx:1(IDX:0)"],
               "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}
    rnd = build_round(read_nodes(SINFO)[0], read_jobs({"jobs": [running]}), NOW)
    (job,) = rnd.request.jobs
    assert (job.progress, job.run_time_s) == (0.4, 1500.0)
    # Requeued by Slurm (not running): its current copy's clock stops.
    pending = {**running, "job_state": "PENDING", "gres_detail": [], "job_resources": {}}
    (job,) = build_round(read_nodes(SINFO)[0], read_jobs({"jobs": [pending]}), NOW).request.jobs
    assert job.run_time_s == 1000.0
    # Moved: the copy's run is added to the job's; the next copy's starts at its report.
    (move,) = plan(rnd, pb.OptimizeResponse(decisions=[_decision("50", "rtx", 2)]))
    assert move.kind == "move"
    assert (move.ticket.ran, move.ticket.running_since, move.ticket.progress) == (
        1500.0, None, 0.4)
    assert move.ticket.run_time(NOW + 600) == 1500.0


def test_a_held_job_that_has_its_shape_is_released_and_older_copies_are_cancelled():
    shape = Shape("rtx", "rtx", 2, 1)
    t = Ticket("40", SPEC, NOW, 1, shape)
    jobs = read_jobs({"jobs": [
        {"job_id": 40, "job_state": "RUNNING", "priority": 5, "comment": t.comment(),
         "gres_detail": ["gpu:rtx:2(IDX:0-1)"],
         "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}},
        {"job_id": 41, "job_state": "PENDING", "priority": 0,
         "state_reason": "JobHeldUser", "comment": t.comment()}]})
    rnd = build_round(read_nodes(SINFO)[0], jobs, NOW)
    assert rnd.stale == (40,) and rnd.jobs["40"].job_id == 41
    # The older copy's GPUs are taken until it is cancelled.
    assert {n.name: n.num_gpus for n in rnd.request.nodes}["rtx-1"] == 2
    actions = plan(rnd, pb.OptimizeResponse(decisions=[_decision("40", "rtx", 2)]))
    assert [(a.kind, a.job_id) for a in actions] == [("cancel", 40), ("release", 41)]


def test_the_job_environment_carries_the_shape_sia_chose():
    t = Ticket("7", SPEC, NOW, 2, Shape("dgx-ext", "a100", 4, 1, 512, 128, 1, 4))
    assert job_environment(t) == {
        "SIA_JOB_ID": "7", "SIA_GENERATION": "2", "SIA_GPU_TYPE": "dgx-ext",
        "SIA_NUM_GPUS": "4", "SIA_NUM_NODES": "1", "SIA_BATCH_SIZE": "512",
        "SIA_ATOMIC_BATCH_SIZE": "128", "SIA_ACCUM_STEPS": "1"}
    exports = env_exports("4", SQUEUE)
    assert "export SIA_JOB_ID=1\n" in exports and "export SIA_GPU_TYPE=rtx\n" in exports
    assert env_exports("3", SQUEUE) == ""  # Slurm's own job


def test_sia_slurm_env_imports_only_the_standard_library_and_the_ticket():
    # It runs at the start of every copy of every job: the policy, numpy, scipy and
    # gRPC (seconds to import) would be paid on every start and every move.
    probe = ("import sys; sys.argv = ['sia-slurm', 'env']; import sia_grpc.slurm.cli as c; "
             "rc = c.main(); heavy = sorted({m.split('.')[0] for m in sys.modules} & "
             "{'numpy', 'scipy', 'grpc', 'google', 'structlog', 'highspy', 'torch'}); "
             "print(rc, heavy, sorted(m for m in sys.modules if m.startswith('sia_grpc')))")
    # (a job id with no Slurm to ask: squeue fails, exit 1, after reading the commands)
    env = {**os.environ, "SLURM_JOB_ID": "999999", "SLURM_CONF": "/nonexistent/slurm.conf"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split(" ", 2)
    assert out[:2] == ["1", "[]"]
    assert "sia_grpc.slurm.commands" in out[2]
    assert "sia_grpc.slurm.translate" not in out[2] and "sia_grpc.slurm.bridge" not in out[2]


def test_sia_slurm_submit_names_the_field_of_a_bad_spec(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("application: cifar10\nadaptivity: adaptive\nmax_gpus: -1\n")
    assert sia(["slurm", "submit", str(spec), "--", "true"]) == 2
    assert "spec.max_gpus" in capsys.readouterr().err
    spec.write_text("application: cifar10\nadaptivity: adaptive\n")
    assert sia(["slurm", "submit", str(spec)]) == 2  # no command anywhere
    assert "spec.command" in capsys.readouterr().err


@pytest.mark.parametrize("app", ["cifar10", "bert"])
def test_seed_profiles_give_every_type_of_the_cluster_an_estimate(app):
    t = Ticket("1", {**SPEC, "application": app}, NOW)
    jobs = read_jobs({"jobs": [{"job_id": 1, "job_state": "PENDING", "priority": 0,
                                "state_reason": "JobHeldUser", "comment": t.comment()}]})
    (job,) = build_round(read_nodes(SINFO)[0], jobs, NOW).request.jobs
    assert {"rtx", "dgx-ext"} <= {s.gpu_type for s in job.samples}


def test_a_job_an_operator_holds_is_left_alone():
    t = Ticket("50", SPEC, NOW)
    jobs = read_jobs({"jobs": [{"job_id": 50, "job_state": "PENDING", "priority": 0,
                                "state_reason": "JobHeldAdmin", "comment": t.comment()}]})
    assert jobs[0].admin_held and not jobs[0].held
    rnd = build_round(read_nodes(SINFO)[0], jobs, NOW)
    assert not rnd.request.jobs and not rnd.jobs


def test_with_queues_a_jobs_slurm_account_names_its_queue_unless_its_spec_does():
    from sia_grpc.api.optimize import optimize_request
    from sia_grpc.policy.queues import QueueSet

    queues = QueueSet.from_mapping({"queue": [{"name": "gold", "guarantee": {"rtx": 2}},
                                              {"name": "silver"}]})
    raw = [("60", "gold", {}), ("61", "nosuch", {}), ("62", "gold", {"queue": "silver"})]
    jobs = read_jobs({"jobs": [
        {"job_id": int(i), "job_state": "PENDING", "priority": 0, "account": account,
         "state_reason": "JobHeldUser", "comment": Ticket(i, {**SPEC, **extra}, NOW).comment()}
        for i, account, extra in raw]})
    nodes = read_nodes(SINFO)[0]
    rnd = build_round(nodes, jobs, NOW, queues=queues, queue_from="account")
    assert [(j.job_id, j.queue) for j in rnd.request.jobs] == [
        ("60", "gold"), ("61", "default"), ("62", "silver")]
    assert {q.name for q in rnd.request.queues.queue} >= {"gold", "silver"}
    assert len(optimize_request(rnd.request).decisions) == 3
    plain = build_round(nodes, jobs, NOW)  # no queues: one pool, whatever the account
    assert {j.queue for j in plain.request.jobs} == {"default"}
    with pytest.raises(ValueError, match="queue_from"):
        build_round(nodes, jobs, NOW, queues=queues, queue_from="qos")


def test_a_job_started_by_hand_holds_its_gpus_and_is_not_sias_to_move():
    t = Ticket("70", SPEC, NOW)  # no shape: an operator gave it GPUs and released it
    jobs = read_jobs({"jobs": [{"job_id": 70, "job_state": "RUNNING", "priority": 9,
                                "comment": t.comment(), "gres_detail": ["gpu:rtx:3(IDX:0-2)"],
                                "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}]})
    rnd = build_round(read_nodes(SINFO)[0], jobs, NOW)
    assert not rnd.request.jobs
    assert {n.name: n.num_gpus for n in rnd.request.nodes}["rtx-1"] == 1


def test_sia_slurm_submit_takes_options_before_the_spec_only(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("application: cifar10\nadaptivity: adaptive\n")
    assert sia(["slurm", "submit", str(spec), "--output", "x.out", "--", "true"]) == 2
    assert "options go before SPEC" in capsys.readouterr().err


def test_a_job_slurm_is_completing_is_not_planned_and_holds_its_gpus_until_gone():
    # (Its script has ended; moving it would run it again in a copy.)
    t = Ticket("80", SPEC, NOW, 0, Shape("rtx", "rtx", 2, 1))
    jobs = read_jobs({"jobs": [{"job_id": 80, "job_state": "COMPLETING", "priority": 5,
                                "comment": t.comment(), "gres_detail": ["gpu:rtx:2(IDX:0-1)"],
                                "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}]})
    rnd = build_round(read_nodes(SINFO)[0], jobs, NOW)
    assert not rnd.request.jobs and not rnd.jobs and rnd.stale == ()
    assert {n.name: n.num_gpus for n in rnd.request.nodes}["rtx-1"] == 2
    assert plan(rnd, pb.OptimizeResponse(decisions=[_decision("80", "dgx-ext", 2)])) == []


def _copies(old_state: str, new_state: str, placed: float | None) -> list:
    """Job 80 moved by the bridge onto 4 rtx: its old copy (Slurm job 80) ending, its
    copy (81, the same sia id, released with the shape) in `new_state`."""
    shape = Shape("rtx", "rtx", 4, 1)
    old, new = Ticket("80", SPEC, NOW - 7200), Ticket("80", SPEC, NOW - 7200, 1, shape,
                                                      placed=placed)
    held = {"gres_detail": ["gpu:rtx:4(IDX:0-3)"],
            "job_resources": {"allocated_nodes": [{"nodename": "rtx-1"}]}}
    return read_jobs({"jobs": [
        {"job_id": 80, "job_state": old_state, "priority": 5, "comment": old.comment(),
         **held},
        {"job_id": 81, "job_state": new_state, "priority": 5, "comment": new.comment(),
         **(held if new_state == "RUNNING" else {})}]})


def test_a_moved_jobs_ending_copy_leaves_its_gpus_to_the_copy_which_is_restoring():
    # The old copy checkpointing (COMPLETING) holds 4 rtx that the move gave its copy:
    # they are the copy's in the round, and the copy keeps them (restoring) until
    # Slurm launches it, not offered to others and the job placed again from nothing.
    rnd = build_round(read_nodes(SINFO)[0], _copies("COMPLETING", "PENDING", NOW - 600), NOW)
    assert {n.name: n.num_gpus for n in rnd.request.nodes}["rtx-1"] == 4
    (prev,) = rnd.request.previous
    assert (prev.job_id, prev.allocation.gpu_type, prev.allocation.num_gpus) == ("80", "rtx", 4)
    (job,) = rnd.request.jobs
    assert job.restoring and rnd.stale == ()
    # Launched: restoring until its first report (the bridge then clears `placed`),
    # and, for a copy that never reports, no longer than its restart cost (50 s).
    assert build_round(read_nodes(SINFO)[0], _copies("CANCELLED", "RUNNING", NOW - 20),
                       NOW).request.jobs[0].restoring
    for placed in (NOW - 60, None):
        (job,) = build_round(read_nodes(SINFO)[0], _copies("CANCELLED", "RUNNING", placed),
                             NOW).request.jobs
        assert not job.restoring


def test_a_job_not_yet_moved_is_priced_at_its_restore_plus_slurms_measured_share():
    # A move through Slurm costs the application's restore plus the launch and the
    # bridge's latency, the same for every job: until a job has its own measurement,
    # it is priced at its application's restore (cifar10's 50 s, imagenet's 250 s)
    # plus the median of what the measured moves cost beyond their restores (here
    # 300, 400 and 900 s measured for cifar10 jobs: 350 s).
    shape = Shape("rtx", "rtx", 1, 1)
    imagenet = {**SPEC, "application": "imagenet"}
    tickets = [Ticket("1", SPEC, NOW, 1, shape, restart_s=300.0),
               Ticket("2", SPEC, NOW, 2, shape, restart_s=400.0),
               Ticket("3", SPEC, NOW, 1, shape, restart_s=900.0), Ticket("4", SPEC, NOW),
               Ticket("5", imagenet, NOW)]
    jobs = read_jobs({"jobs": [  # (released with their shapes; the last held, waiting)
        {"job_id": 10 + i, "job_state": "PENDING", "comment": t.comment(),
         **({"priority": 5} if t.shape else {"priority": 0, "state_reason": "JobHeldUser"})}
        for i, t in enumerate(tickets)]})
    costs = {j.job_id: j.restart_cost_s
             for j in build_round(read_nodes(SINFO)[0], jobs, NOW).request.jobs}
    assert costs == {"1": 300.0, "2": 400.0, "3": 900.0, "4": 400.0, "5": 600.0}
    alone = build_round(read_nodes(SINFO)[0], jobs[3:], NOW).request.jobs
    assert [j.restart_cost_s for j in alone] == [50.0, 250.0]  # nothing measured: own
    # Before any move, first starts measure Slurm's share (imagenet's launch took
    # 250 + 330 s): the others are priced with it from then on.
    launched = Ticket("5", imagenet, NOW, 0, shape, launch_s=580.0)
    early = read_jobs({"jobs": [
        {"job_id": 13, "job_state": "PENDING", "comment": tickets[3].comment(),
         "priority": 0, "state_reason": "JobHeldUser"},
        {"job_id": 14, "job_state": "PENDING", "comment": launched.comment(), "priority": 5}]})
    costs = {j.job_id: j.restart_cost_s
             for j in build_round(read_nodes(SINFO)[0], early, NOW).request.jobs}
    assert costs == {"4": 50.0 + 330.0, "5": 250.0 + 330.0}


def test_a_ticket_fits_in_a_slurm_comment_however_many_shapes_the_job_ran():
    """Slurm keeps at most 1024 characters of a job's comment and refuses an update
    past it: a job that had run many shapes could no longer be noted, moved or started
    (the 60x bench left one held for good on an idle cluster). The step times of the
    fewest steps are left out first."""
    from sia_grpc.slurm.ticket import COMMENT_MAX

    shape = Shape("rtx", "rtx", 8, 2, 640, 80, 0, 8, nodes=(("rtx-0", 4), ("rtx-1", 4)))
    obs = tuple(("rtx", 1, r, b, 0, 1000 - b, 0.123456789 * b, 0.000891234567)
                for r in (1, 2, 4, 8) for b in range(10, 110, 10))
    t = Ticket("34", {**SPEC, "name": "deepspeech2-16"}, NOW, 7, shape, obs=obs,
               grad=(1.3e-09, 3.9e-06), placed=NOW, launch_s=74.7, progress=0.7, ran=53.5,
               running_since=NOW)
    text = t.comment()
    assert len(text) <= COMMENT_MAX
    kept = Ticket.parse(text, 34)
    assert kept is not None and kept.shape == shape and 0 < len(kept.obs) < len(obs)
    assert min(o[5] for o in kept.obs) >= max(o[5] for o in set(obs) - {
        next(p for p in obs if p[:5] == k[:5]) for k in kept.obs})  # (the most steps kept)
    assert all(o[6] == float(f"{o[6]:.4g}") for o in kept.obs)
    small = replace(t, obs=obs[:2])
    assert len(Ticket.parse(small.comment(), 34).obs) == 2  # all kept where they fit


def test_a_spec_too_long_for_a_slurm_comment_is_refused_at_submission():
    from sia_grpc.client.spec import SpecError
    from sia_grpc.slurm.submit import ticket_for

    spec = pb.JobSpec(name="x", application="cifar10", adaptivity=pb.ADAPTIVITY_ADAPTIVE,
                      labels={f"k{i}": "v" * 40 for i in range(20)})
    with pytest.raises(SpecError, match="spec.*Slurm comment"):
        ticket_for(spec)
    ticket_for(pb.JobSpec(name="x", application="cifar10",
                          adaptivity=pb.ADAPTIVITY_ADAPTIVE))  # (an ordinary one fits)
