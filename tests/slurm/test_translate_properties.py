"""Invariants of the translation over generated clusters and queues: Sia is never
offered a GPU that Slurm's own jobs hold, the previous allocations fit the offered
nodes without sharing a GPU, and the plan touches only opted-in jobs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.api import pb
from sia_grpc.slurm.translate import Shape, Ticket, build_round, plan, read_jobs, read_nodes

SPEC = {"application": "cifar10", "adaptivity": "adaptive"}
TYPES = ("rtx", "a100")


@st.composite
def scenes(draw):
    nodes = [(f"n{i}", draw(st.sampled_from(TYPES)), draw(st.integers(1, 8)))
             for i in range(draw(st.integers(1, 5)))]
    free = {name: count for name, _, count in nodes}
    kind = {name: t for name, t, _ in nodes}
    jobs = []
    for job_id in range(1, draw(st.integers(0, 12)) + 1):
        what = draw(st.sampled_from(["own", "waiting", "running", "released"]))
        job = {"job_id": job_id, "priority": 1, "job_state": "PENDING", "comment": ""}
        if what in ("own", "running"):
            node = draw(st.sampled_from([n for n, _, _ in nodes]))
            if free[node] == 0:
                continue
            take = draw(st.integers(1, free[node]))
            free[node] -= take
            job.update(job_state="RUNNING", gres_detail=[f"gpu:{kind[node]}:{take}(IDX:0)"],
                       job_resources={"allocated_nodes": [{"nodename": node}]})
        if what != "own":
            shape = None
            if what == "running":
                shape = Shape(kind[node], kind[node], take, 1)
            elif what == "released":
                shape = Shape(draw(st.sampled_from(TYPES)), "x", draw(st.integers(1, 8)),
                              draw(st.integers(1, 2)))
            else:
                job.update(priority=0, state_reason="JobHeldUser")
            job["comment"] = Ticket(str(job_id), SPEC, 0.0, 0, shape).comment()
        jobs.append(job)
    sinfo = {"nodes": [{"name": n, "state": "idle", "state_flags": [], "gres": f"gpu:{t}:{c}"}
                       for n, t, c in nodes]}
    return sinfo, {"jobs": jobs}


@settings(max_examples=60, deadline=None)
@given(scene=scenes(), data=st.data())
def test_sia_is_offered_only_free_gpus_and_the_plan_touches_only_its_jobs(scene, data):
    sinfo, squeue = scene
    nodes, _ = read_nodes(sinfo)
    jobs = read_jobs(squeue)
    rnd = build_round(nodes, jobs, 100.0)
    offered = {n.name: n.num_gpus for n in rnd.request.nodes}
    size = {n.name: n.num_gpus for n in nodes}
    own = {}
    for j in jobs:
        if j.ticket is None:
            for n, c in j.gpus.items():
                own[n] = own.get(n, 0) + c
    for name, gpus in size.items():
        assert offered.get(name, 0) == gpus - own.get(name, 0)
    refs = [(g.node, g.index) for p in rnd.request.previous for g in p.allocation.gpus]
    assert len(refs) == len(set(refs))
    assert all(i < offered[n] for n, i in refs)
    ours = {j.job_id for j in jobs if j.ticket is not None}
    decisions = []
    for j in rnd.request.jobs:
        d = pb.JobDecision(job_id=j.job_id)
        if data.draw(st.booleans()):
            d.allocation.CopyFrom(pb.Allocation(gpu_type=data.draw(st.sampled_from(TYPES)),
                                                num_gpus=data.draw(st.integers(1, 4)),
                                                num_nodes=1))
        decisions.append(d)
    for action in plan(rnd, pb.OptimizeResponse(decisions=decisions)):
        assert action.job_id in ours
        if action.kind in ("start", "move"):
            assert action.ticket.id == str(action.job_id)
