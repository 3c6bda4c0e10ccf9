"""The controller's solver process builds its policy from the controller's policy
settings and round length, and its rounds run that policy."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell import solver_pool
from sia_grpc.controller.shell.server import Controller
from sia_grpc.controller.shell.solver_pool import SolverPool, ship, solve_shipped
from sia_grpc.emulation import load_app
from sia_grpc.models.bootstrap import JobGoodputModel, ThroughputEstimator
from sia_grpc.policy import Cluster, PolicyJob, SiaPolicy, make_policy
from sia_grpc.policy.params import PolicySpec
from sia_grpc.policy.queues import PriorityClass, Queue, QueueSet

CLUSTER = Cluster.uniform({"aws": (1, 4), "rtx": (1, 8)})


def job(job_id: str, app_name: str) -> PolicyJob:
    """A job with Sia's 1-GPU profiles of every type, as after profiling."""
    app = load_app(app_name)
    est = ThroughputEstimator()
    for t in app.gpu_types:
        lo, hi = app.local_bsz_limits(t)
        for b in np.unique(np.geomspace(lo, hi, 6).round()):
            est.add_profile(t, int(b), *app.step_time(t, 1, 1, int(b)))
    model = JobGoodputModel(estimator=est, grad=app.grad_params(0.0),
                            init_batch_size=app.init_batch_size,
                            max_batch_size=app.max_batch_size,
                            local_bsz_limits={t: app.local_bsz_limits(t) for t in app.gpu_types})
    return PolicyJob(job_id=job_id, model=model, age=600.0, restart_cost=app.restart_delay)


JOBS = [job(f"j{i}", a) for i, a in enumerate(["cifar10", "ncf", "bert", "yolov3"])]


async def test_controller_solver_process_builds_the_configured_policy():
    config = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:", round_duration=30.0,
                              policy_params={"sia": {"p": "1", "hold_restoring": "false"},
                                             "pollux": {"p": -3}})
    assert not config.inline_solver  # a spawned process, as in production
    async with Controller(config) as c:
        policy = c.policy  # built in the solver process at start-up, sent back
    assert isinstance(policy, SiaPolicy)
    assert (policy.config.p, policy.config.hold_restoring) == (1.0, False)
    assert policy.round_duration == 30.0  # the controller's round, not a second setting
    async with Controller(ControllerConfig(listen="127.0.0.1:0", db_path=":memory:",
                                           inline_solver=True)) as c:
        assert c.policy == make_policy("sia", round_duration=60.0)


async def test_rounds_in_the_solver_process_use_the_setting():
    """λ below every job's value for p < 0 makes leaving jobs out the better choice:
    the same round with and without it decides differently, and exactly as the
    policy built here does."""
    default = make_policy("sia").optimize(CLUSTER, JOBS, {})
    assert len(default.allocations) == len(JOBS)
    pool = SolverPool(PolicySpec("sia", (("lambda_", 0.5),)))
    try:
        result = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
    finally:
        pool.close()
    want = make_policy("sia", {"lambda": 0.5}).optimize(CLUSTER, JOBS, {})
    assert dict(result.allocations) == dict(want.allocations) == {}


async def test_the_queues_reach_the_solver_process():
    """A QueueSet does not pickle: it crosses to the solver process in its wire form
    and comes back as the same decision (here priority weights and what each queue
    holds; no guarantee, so no side rows)."""
    queues = QueueSet(queues=(Queue("research"), Queue("batch")),
                      priority_classes=(PriorityClass("production", 10.0),))
    jobs = [dataclasses.replace(j, queue=q, priority=p)
            for j, (q, p) in zip(JOBS, [("research", "production"), ("batch", ""),
                                        ("batch", ""), ("default", "")], strict=True)]
    pool = SolverPool(PolicySpec("sia", ()))
    try:
        result = await pool.solve(CLUSTER, jobs, {}, timeout=120.0, queues=queues)
    finally:
        pool.close()
    want = make_policy("sia").optimize(CLUSTER, jobs, {}, queues=queues)
    assert dict(result.allocations) == dict(want.allocations)
    assert result.queues == want.queues and set(result.queues) >= {"research", "batch"}


async def test_the_solver_process_keeps_its_estimates_across_rounds():
    """Every round ships the jobs' models to the solver process anew (pickled); the
    second round of unchanged jobs finds every estimate the first made (the cache
    is keyed by content, not by the object that arrived), and a job whose model
    learnt something is estimated afresh."""
    pool = SolverPool(PolicySpec("sia", ()))
    try:
        first = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
        second = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
        changed = job("j0", "cifar10")  # an estimator of its own: new to the process
        third = await pool.solve(CLUSTER, [changed, *JOBS[1:]], {}, timeout=120.0)
    finally:
        pool.close()
    assert first.solver_stats["estimates_made"] == len(JOBS)
    assert second.solver_stats["estimates_found"] == len(JOBS)
    assert second.solver_stats["estimates_made"] == 0
    assert third.solver_stats["estimates_made"] == 1
    assert dict(second.allocations) == dict(first.allocations)


async def test_a_round_ships_the_estimators_the_solver_process_holds_by_reference():
    """Each job's estimator (most of its bytes) goes by (uid, version) where the worker
    has it from the last round; the answers are the same, a changed estimator goes in
    full, and a new worker (the old one killed) gets the round again in full."""
    pool = SolverPool(PolicySpec("sia", ()))
    try:
        first = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
        full = pool.shipped_bytes
        second = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
        by_reference = pool.shipped_bytes
        changed = job("j0", "cifar10")
        third = await pool.solve(CLUSTER, [changed, *JOBS[1:]], {}, timeout=120.0)
        one_new = pool.shipped_bytes
        pool._pool.shutdown(wait=True)  # (a worker gone without the pool knowing:
        pool._pool = None               # the next one holds nothing)
        fourth = await pool.solve(CLUSTER, JOBS, {}, timeout=120.0)
    finally:
        pool.close()
    assert by_reference < full / 3 and by_reference < one_new < full
    assert dict(second.allocations) == dict(first.allocations)
    assert third.solver_stats["estimates_made"] == 1  # (the others found, as before)
    assert dict(fourth.allocations) == dict(first.allocations)
    assert pool.shipped_bytes == full  # asked for again in full


async def test_an_estimator_that_learnt_something_goes_as_its_changes():
    """A running job's estimator gains step times between rounds: it goes to the worker
    that holds it from the last round as the changes since, fewer bytes than in full,
    and the round's answer is the one a worker given everything in full makes."""
    apps = ["cifar10", "ncf", "bert", "yolov3"]
    jobs = [job(f"j{i}", a) for i, a in enumerate(apps)]
    pool, fresh = SolverPool(PolicySpec("sia", ())), SolverPool(PolicySpec("sia", ()))
    try:
        await pool.solve(CLUSTER, jobs, {}, timeout=120.0)
        full = pool.shipped_bytes
        for j, name in zip(jobs, apps, strict=True):  # telemetry: one shape's step times
            step, sync = load_app(name).step_time("rtx", 1, 2, 32)
            j.model.estimator.add_observation("rtx", 1, 2, 32, 0, step, sync)
        second = await pool.solve(CLUSTER, jobs, {}, timeout=120.0)
        by_changes = pool.shipped_bytes
        want = await fresh.solve(CLUSTER, jobs, {}, timeout=120.0)
    finally:
        pool.close()
        fresh.close()
    assert by_changes < full / 2
    assert dict(second.allocations) == dict(want.allocations)
    assert second.objective == want.objective


def test_a_shipped_round_is_unpickled_and_solved_with_the_collector_paused(
        monkeypatch: pytest.MonkeyPatch):
    """The worker pauses the collector from the unpickling on: in a worker holding
    the last round, unpickling the next set off full collections."""
    payload, _ = ship(CLUSTER, JOBS, {}, frozenset())
    enabled = []
    load = solver_pool._Receiving.load

    def spied(self):
        enabled.append(gc.isenabled())
        return load(self)

    monkeypatch.setattr(solver_pool._Receiving, "load", spied)
    result = solve_shipped(PolicySpec("sia", ()), payload)
    assert result is not None and result.allocations
    assert enabled == [False] and gc.isenabled()
