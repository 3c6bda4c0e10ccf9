"""Queues in the policy: the model and its validation, and property tests over whole
rounds that the allocation honours every guarantee the demand allows, every borrowing
limit, the restart budget and the minimum runtime."""

from __future__ import annotations

import dataclasses
import tomllib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from test_policy_properties import check_round
from test_policy_sia import LinearModel

from sia_grpc.policy import Adaptivity, Cluster, Node, PolicyJob, lazy_rows, make_policy
from sia_grpc.policy.errors import FieldError
from sia_grpc.policy.queues import DEFAULT_QUEUE, PriorityClass, Queue, QueueSet
from sia_grpc.policy.queues.rows import owed

EXAMPLE = """
unit_weights = {rtx = 1.0, dgx-ext = 3.0}
min_runtime_s = 300
max_restarts_per_round = 8
default_priority = "batch"

[[priority_class]]
name = "production"
weight = 100
[[priority_class]]
name = "batch"
[[priority_class]]
name = "best-effort"
weight = 0.1

[[queue]]
name = "research"
tenants = ["team-a", "team-b"]
guarantee = {rtx = 8, dgx-ext = 4}
borrow_limit = {rtx = 4}

[[queue]]
name = "prod"
guarantee_units = 16
min_runtime_s = 0
"""


def test_a_queue_file_reads_into_queues_classes_and_bounds():
    qs = QueueSet.from_mapping(tomllib.loads(EXAMPLE))
    assert [q.name for q in qs.queues] == ["research", "prod", DEFAULT_QUEUE]
    research = qs.queue("research")
    assert research.admits("team-a") and not research.admits("team-c")
    assert qs.queue("prod").admits("anyone")  # no tenants listed: every tenant
    assert (research.cap("rtx"), research.cap("dgx-ext")) == (12, None)
    assert qs.queue("").name == DEFAULT_QUEUE and qs.priority("").name == "batch"
    assert (qs.weight("production"), qs.weight("batch"), qs.weight("best-effort")) == \
        (100.0, 1.0, 0.1)
    assert (qs.unit_weight("dgx-ext"), qs.unit_weight("aws")) == (3.0, 1.0)
    assert (qs.min_runtime("research"), qs.min_runtime("prod")) == (300.0, 0.0)
    assert qs.oversubscribed({"rtx": 4, "dgx-ext": 8}) == ["rtx"]


@pytest.mark.parametrize(("text", "field"), [
    ('[[queue]]\nname = "a"\nguarantee = {rtx = -1}\n', "queue[0].guarantee.rtx"),
    ('[[queue]]\nname = "a"\nguarantee = {rtx = 1.5}\n', "queue[0].guarantee.rtx"),
    ('[[queue]]\nname = "a b"\n', "queue[0].name"),
    ('[[queue]]\nname = "a"\ncolour = "red"\n', "queue[0].colour"),
    ('[[queue]]\nname = "a"\n[[queue]]\nname = "a"\n', "queue"),
    ('[[priority_class]]\nname = "p"\nweight = 0\n', "priority_class[0].weight"),
    ('max_restarts_per_round = -1\n', "max_restarts_per_round"),
    ('unit_weights = {rtx = 0}\n', "unit_weights.rtx"),
    ('queues = 3\n', "queues"),
])
def test_a_bad_queue_file_names_the_key(text, field):
    with pytest.raises(FieldError) as err:
        QueueSet.from_mapping(tomllib.loads(text))
    assert err.value.field == field


def test_an_unknown_queue_or_class_names_what_exists():
    qs = QueueSet(queues=(Queue("a"),), priority_classes=(PriorityClass("hi", 10),))
    with pytest.raises(FieldError, match="unknown queue 'b'; the cluster has a, default"):
        qs.queue("b")
    with pytest.raises(FieldError, match="unknown priority class 'x'; the classes are hi"):
        qs.priority("x")


# ---------------------------------------------------------------- whole rounds

TYPES = ("a", "b")


def linear(speed: float = 1.0) -> LinearModel:
    return LinearModel({t: speed for t in TYPES}, 0.9)


def job(i: int, queue: str, *, priority: str = "", **kw) -> PolicyJob:
    kw.setdefault("age", 3600.0)
    kw.setdefault("restart_cost", 30.0)
    return PolicyJob(job_id=f"{queue}-{i}", model=kw.pop("model", linear()), queue=queue,
                     priority=priority, **kw)


def test_a_queue_below_its_guarantee_reclaims_from_a_borrower():
    """B borrows the whole cluster while A is idle; A's jobs arrive: the next round A
    holds its guarantee, taken from B (the borrower), never from A's own."""
    cl = Cluster.uniform({"a": (2, 8)})
    qs = QueueSet(queues=(Queue("A", guarantee={"a": 8}), Queue("B", guarantee={"a": 4})))
    sia = make_policy("sia")
    b_jobs = [job(i, "B", max_gpus=8) for i in range(2)]
    prev = {}
    for _ in range(4):  # B grows onto the idle cluster
        res = sia.optimize(cl, b_jobs, prev, queues=qs)
        prev = dict(res.allocations)
    assert res.queues["B"]["a"] == 16
    jobs = b_jobs + [job(i, "A", max_gpus=8, age=0.0) for i in range(8)]
    res = sia.optimize(cl, jobs, prev, queues=qs)
    check_round(cl, jobs, res)
    assert res.queues["A"]["a"] >= 8 and res.queues["B"]["a"] >= 4
    activity, bound = res.rows["guarantee A/a"]
    assert activity <= bound  # (−held ≤ −owed: held ≥ owed)


def test_priority_weights_serve_the_higher_class_first():
    cl = Cluster.uniform({"a": (1, 4)})
    qs = QueueSet(priority_classes=(PriorityClass("high", 100.0), PriorityClass("low", 1.0)))
    jobs = [job(0, DEFAULT_QUEUE, priority="low", num_gpus=4, adaptivity=Adaptivity.RIGID,
                batch_size=128, model=linear(4.0)),
            job(1, DEFAULT_QUEUE, priority="high", num_gpus=4, adaptivity=Adaptivity.RIGID,
                batch_size=128, model=linear(1.0))]
    res = make_policy("sia").optimize(cl, jobs, {}, queues=qs)
    assert set(res.allocations) == {f"{DEFAULT_QUEUE}-1"}


def test_partitioned_queues_stay_in_their_partitions():
    cl = Cluster.uniform({"a": (2, 8)})
    qs = QueueSet(queues=(Queue("A", guarantee={"a": 4}), Queue("B", guarantee={"a": 12})))
    jobs = [job(i, "A", max_gpus=16) for i in range(2)]  # B idle: A may not borrow
    prev = {}
    for _ in range(4):
        res = make_policy("sia-partitioned").optimize(cl, jobs, prev, queues=qs)
        prev = dict(res.allocations)
    assert res.queues["A"]["a"] <= 4


@st.composite
def queue_rounds(draw):
    nodes = [Node(f"{t}{k}", t, 4) for t in TYPES for k in range(draw(st.integers(1, 3)))]
    cluster = Cluster.of(nodes)
    names = [f"q{k}" for k in range(draw(st.integers(1, 3)))]
    left = dict(cluster.capacity)
    queues = []
    for name in names:  # guarantees in whole nodes: attainable whatever the others do
        # (save what jobs held for their minimum runtime take: `crowded_out`)
        g = {}
        for t in TYPES:
            nodes_t = draw(st.integers(0, left[t] // 4))
            if nodes_t:
                g[t] = 4 * nodes_t
                left[t] -= 4 * nodes_t
        limit = {t: draw(st.integers(0, 8)) for t in TYPES if draw(st.booleans())}
        queues.append(Queue(name, guarantee=g, borrow_limit=limit))
    qs = QueueSet(queues=tuple(queues),
                  min_runtime_s=draw(st.sampled_from([0.0, 0.0, 120.0])),
                  max_restarts_per_round=draw(st.sampled_from([None, None, 1, 3])))
    jobs = [job(i, draw(st.sampled_from(names)), max_gpus=draw(st.sampled_from([4, 8, 16])),
                model=linear(draw(st.floats(0.5, 4.0))),
                stint=draw(st.sampled_from([0.0, 60.0, 600.0])))
            for i in range(draw(st.integers(1, 12)))]
    return cluster, qs, jobs


# Hypothesis's find: q2's job borrows an `a` GPU in the first round (a tie with `b`:
# same speed). In the second, every job but q0-2 and q1-5 is held for the minimum
# runtime (60 s on its allocation of 120), q2's on `a` too: q0 or q1 can grow to its
# 4 `a` GPUs, not both (4 + 4 + q2's 1 > 8); the eager round gives q1 3 as well.
HELD_BORROWER = (
    Cluster.of([Node("a0", "a", 4), Node("a1", "a", 4), Node("b0", "b", 4)]),
    QueueSet(queues=(Queue("q0", guarantee={"a": 4}), Queue("q1", guarantee={"a": 4}),
                     Queue("q2")), min_runtime_s=120.0),
    [job(i, q, max_gpus=4, stint=stint) for i, (q, stint) in enumerate(
        [("q0", 0.0), ("q0", 0.0), ("q0", 60.0), ("q1", 0.0), ("q1", 0.0), ("q1", 60.0),
         ("q2", 0.0)])],
)


def charged_restarts(qs: QueueSet, jobs, prev, res) -> list[str]:
    """Running jobs whose configuration the round changed, as the restart budget
    counts them: not a job of a queue holding less than it is owed that grows on its
    type (nor a move between nodes of one type, the placer's, not the ILP's)."""
    held: dict = {}
    for j in jobs:
        if j.job_id in prev:
            c = prev[j.job_id].config
            key = (qs.queue(j.queue).name, c.gpu_type)
            held[key] = held.get(key, 0) + c.num_gpus
    below = {name.split()[1].split("/")[0] for name, (_, bound) in res.rows.items()
             if name.startswith("guarantee") and not name.endswith("/units")
             and held.get(tuple(name.split()[1].split("/")), 0) < -bound}
    out = []
    for j in jobs:
        before, after = prev.get(j.job_id), res.allocations.get(j.job_id)
        if before is None or (after is not None and after.config == before.config):
            continue
        grows = (after is not None and qs.queue(j.queue).name in below
                 and after.config.gpu_type == before.config.gpu_type
                 and after.config.num_gpus > before.config.num_gpus)
        if not grows:
            out.append(j.job_id)
    return out


def reclaim_blocked(res, qs: QueueSet, jobs, queue: str, gpu_type: str, short: float) -> bool:
    """Whether meeting `queue`'s shortfall of `short` GPUs of `gpu_type` would take more
    preemptions than the round's restart budget has left: the fewest other queues'
    jobs holding that type whose GPUs cover it, beyond what is left of the budget."""
    if short <= 0 or "restarts" not in res.rows:
        return False
    used, budget = res.rows["restarts"]
    left = budget - used
    theirs = sorted((a.config.num_gpus for j_id, a in res.allocations.items()
                     if a.config.gpu_type == gpu_type
                     and qs.queue(next(j.queue for j in jobs if j.job_id == j_id)).name != queue),
                    reverse=True)
    need = next((k + 1 for k in range(len(theirs)) if sum(theirs[:k + 1]) >= short),
                len(theirs) + 1)
    return need > left + 1e-9


def crowded_out(rows, qs: QueueSet, jobs, prev, cluster: Cluster, gpu_type: str) -> float:
    """GPUs of `gpu_type` that the guarantee rows in `rows` go short of together in
    every allocation: a running job younger on its allocation than its queue's
    minimum runtime keeps it (`min_runtime_holds`), so where what the held jobs hold
    plus what each queue is owed beyond its own held jobs is more than the type has,
    the queues fall short by the difference. The guarantees are whole nodes that fit
    together, but a borrower's job held on the type takes from all of them at once;
    each queue's silo (and `guarantee_caps`) sees only its own guarantee, and the
    rows are soft, one penalty per GPU short, so the round picks who goes short
    (`HELD_BORROWER`: the round with every silo solved up front gives q1 3 of its 4
    as well)."""
    need: dict[str, float] = {}
    for j in jobs:
        a = prev.get(j.job_id)
        if a is not None and a.config.gpu_type == gpu_type and j.stint < qs.min_runtime(j.queue):
            q = qs.queue(j.queue).name
            need[q] = need.get(q, 0.0) + a.config.num_gpus
    for name, (_, bound) in rows.items():
        kind, _, where = name.partition(" ")
        q, _, t = where.partition("/")
        if kind == "guarantee" and t == gpu_type:
            need[q] = max(need.get(q, 0.0), -bound)
    return max(sum(need.values()) - cluster.capacity[gpu_type], 0.0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=queue_rounds(), policy=st.sampled_from(["sia", "sia-partitioned"]))
@example(case=HELD_BORROWER, policy="sia")
def test_rounds_honour_guarantees_limits_budget_and_minimum_runtime(case, policy):
    cluster, qs, jobs = case
    pol = make_policy(policy)
    prev: dict = {}
    for _ in range(3):
        res = pol.optimize(cluster, jobs, prev, queues=qs)
        check_round(cluster, jobs, res)
        for q in qs.queues:
            for t in TYPES:
                held = res.queues[q.name][t]
                name = f"guarantee {q.name}/{t}"
                if policy == "sia" and name in res.rows:  # what its jobs could use, up to
                    activity, bound = res.rows[name]      # the guarantee
                    # The restart budget is hard, a guarantee soft: a reclaim that needs
                    # more preemptions than the budget has left waits for a later round;
                    # so does one that jobs held for their minimum runtime leave no
                    # room for.
                    crowd = crowded_out(res.rows, qs, jobs, prev, cluster, t)
                    if not reclaim_blocked(res, qs, jobs, q.name, t, -bound - held - crowd):
                        assert -activity >= -bound - crowd, (name, held, bound, crowd)
                cap = (q.guarantee.get(t, 0) if policy == "sia-partitioned" else q.cap(t))
                if cap is not None:
                    assert held <= cap, (q.name, t, held, cap)
        if qs.max_restarts_per_round is not None:
            assert len(charged_restarts(qs, jobs, prev, res)) <= qs.max_restarts_per_round
        for j in jobs:  # younger than the minimum runtime on its allocation: kept
            # (its shape; the placer moves a held job only where no other eviction
            # makes room for a job that grows: test_placer_moves_a_pinned_job_last)
            if j.job_id in prev and j.stint < qs.min_runtime(j.queue):
                kept = res.allocations.get(j.job_id)
                assert kept is not None and kept.config == prev[j.job_id].config, j.job_id
        prev = dict(res.allocations)
        jobs = [dataclasses.replace(j, age=j.age + 60.0, stint=j.stint + 60.0) for j in jobs]
    assume(len(jobs) > 0)
    assert np.isfinite(res.objective)


def test_owed_counts_each_job_once_on_one_type():
    """A job runs on one type: a queue guaranteed 4 of each of two types, whose jobs
    are one that can use either and one that can use only the first, is owed both
    (the flexible one covers the second type); a lone flexible job covers one."""
    job_ix, typ, amount = np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([8.0, 8.0, 4.0])
    assert owed(job_ix, typ, amount, {0: 4, 1: 4}) == {0: 4.0, 1: 4.0}
    assert sum(owed(job_ix[:2], typ[:2], amount[:2], {0: 4, 1: 4}).values()) == 4.0
    # One guaranteed type: min(guarantee, Σ largest options), as before.
    assert owed(np.array([0, 0, 1]), np.array([0, 0, 0]), np.array([2.0, 4.0, 1.0]),
                {0: 8}) == {0: 5.0}


def test_a_job_held_for_its_minimum_runtime_does_not_grow_into_idle_gpus():
    cl = Cluster.uniform({"a": (1, 8)})
    qs = QueueSet(min_runtime_s=600.0)
    first = make_policy("sia").optimize(cl, [job(0, DEFAULT_QUEUE, max_gpus=8)], {},
                                        queues=qs)
    (alloc,) = first.allocations.values()
    young = job(0, DEFAULT_QUEUE, max_gpus=8, stint=60.0)
    res = make_policy("sia").optimize(cl, [young], dict(first.allocations), queues=qs)
    assert res.allocations[young.job_id].gpus == alloc.gpus


def test_placer_moves_a_pinned_job_last():
    """Room for a growing 2-GPU job on a node of four 1-GPU jobs: the placer evicts
    a job that is not pinned (held for its queue's minimum runtime) if there is one."""
    from sia_grpc.policy.cluster import Config, GpuId
    from sia_grpc.policy.placer import place

    cl = Cluster.of([Node("a0", "a", 4), Node("a1", "a", 4)])
    one, two = Config("a", 1, 1), Config("a", 1, 2)
    prev = {f"j{k}": (GpuId("a0", k),) for k in range(4)} | {
        "j4": (GpuId("a1", 0),), "j5": (GpuId("a1", 1),), "j6": (GpuId("a1", 2),)}
    alloc = {j: one for j in prev} | {"j0": two}
    pinned = frozenset(j for j in prev if j != "j0") - {"j6"}
    plain = place(cl, alloc, prev)  # (without pins it moves a job the pins keep)
    assert any(plain.placements[j] != prev[j] for j in pinned)
    res = place(cl, alloc, prev, pinned)
    assert all(res.placements[j] == prev[j] for j in pinned)


def test_a_rounds_warm_start_speeds_the_next_silos_not_their_answer():
    """Each round leaves its queues' silo prices and choices (`RoundResult.warm`);
    given back, fewer of the next round's silos need a solve of their own, and the
    round's answer is the one a cold round gives, up to the solver's gap."""
    from sia_grpc.bench.scenarios import sample_jobs
    from sia_grpc.bench.solver_rows import policy_queues
    from sia_grpc.policy.cluster import paper_hetero_cluster

    rng = np.random.default_rng(3)
    cl = paper_hetero_cluster(4)
    qs, split = policy_queues(rng, cl, 4, num_jobs=200)
    names = [q.name for q in qs.queues]
    jobs = [dataclasses.replace(j, queue=names[int(k)]) for j, k in
            zip(sample_jobs(rng, 200, cl), rng.choice(4, size=200, p=split), strict=True)]
    sia = make_policy("sia")
    prev, warm, alone_warm, alone_cold = {}, None, 0.0, 0.0
    for _ in range(4):
        res = sia.optimize(cl, jobs, prev, queues=qs, warm=warm)
        cold = sia.optimize(cl, jobs, prev, queues=qs)
        assert res.objective == pytest.approx(cold.objective, rel=1e-3)
        assert set(res.warm.silos) == {q.name for q in qs.queues if q.guarantee}
        assert res.solver_stats["silo_solves"] == len(res.warm.silos)
        alone_warm += res.solver_stats["silo_alone"]
        alone_cold += cold.solver_stats["silo_alone"]
        warm, prev = res.warm, dict(res.allocations)
        jobs = [dataclasses.replace(j, age=j.age + sia.round_duration) for j in jobs]
    assert alone_warm < alone_cold


def test_a_round_with_queues_starts_from_the_last_rounds_row_prices():
    """A round with queues leaves its capacity prices and each side row's by name
    (`WarmStart.row_prices`); the next round, given them, tries them first and, once
    the rounds settle (the same jobs, no restart budget to spread the moves over
    rounds), they prove its start with no Dantzig-Wolfe iteration. Its answer is
    within the solver's gap of the same round solved cold, which iterates."""
    from sia_grpc.bench.scenarios import sample_jobs
    from sia_grpc.bench.solver_rows import policy_queues
    from sia_grpc.policy.cluster import paper_hetero_cluster

    rng = np.random.default_rng(5)
    cl = paper_hetero_cluster(8)
    qs, split = policy_queues(rng, cl, 4, num_jobs=400)
    qs = dataclasses.replace(qs, max_restarts_per_round=None)
    names = [q.name for q in qs.queues]
    jobs = [dataclasses.replace(j, queue=names[int(k)]) for j, k in
            zip(sample_jobs(rng, 400, cl), rng.choice(4, size=400, p=split), strict=True)]
    sia = make_policy("sia")
    prev, warm = {}, None
    for _ in range(5):
        res = sia.optimize(cl, jobs, prev, queues=qs, warm=warm)
        cold = sia.optimize(cl, jobs, prev, queues=qs)
        assert res.objective == pytest.approx(cold.objective, rel=2e-4)
        assert len(res.warm.prices) == len(cl.gpu_types)
        assert set(res.warm.row_prices) == set(res.rows)
        assert all(v >= 0 for v in res.warm.row_prices.values())
        assert cold.solver_stats.get("hinted", 0.0) == 0.0
        warm, prev = res.warm, dict(res.allocations)
    assert res.solver_stats["hinted"] == 1.0 and res.solver_stats["dw_iters"] == 0.0
    assert cold.solver_stats["dw_iters"] > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=queue_rounds())
@example(case=HELD_BORROWER)
def test_silos_solved_lazily_give_the_answer_of_every_row(case):
    """A round solves the silos of only the queues its answer leaves below what they
    could be owed (`lazy_rows.guaranteed_round`): constraint generation, so its
    answer is an optimum of the round with every queue's guarantee rows — the same
    objective up to the solver's gap as the round that solves every silo first
    (`LAZY_ROWS = False`), and every queue holds what that round says it is owed
    (where the restart budget and the jobs held for their minimum runtime let the
    reclaim happen this round: `reclaim_blocked`, `crowded_out`)."""
    cluster, qs, jobs = case
    pol = make_policy("sia")
    prev: dict = {}
    for _ in range(3):
        lazy = pol.optimize(cluster, jobs, prev, queues=qs)
        lazy_rows.LAZY_ROWS = False
        try:
            eager = pol.optimize(cluster, jobs, prev, queues=qs)
        finally:
            lazy_rows.LAZY_ROWS = True
        assert lazy.objective == pytest.approx(eager.objective, rel=3e-4, abs=1e-6)
        assert lazy.solver_stats.get("silo_solves", 0) <= eager.solver_stats.get("silo_solves", 0)
        for name, (_, bound) in eager.rows.items():
            kind, _, where = name.partition(" ")
            q, _, t = where.partition("/")
            if kind != "guarantee" or t == "units":
                continue
            held = lazy.queues[q][t]
            _, reported = lazy.rows[name]  # (its silo's, or a bound above it)
            for rows, owed_here in ((eager.rows, bound), (lazy.rows, reported)):
                short = -owed_here - held - crowded_out(rows, qs, jobs, prev, cluster, t)
                if not reclaim_blocked(lazy, qs, jobs, q, t, short):
                    assert short <= 0, (name, held, owed_here, short)
        prev = dict(lazy.allocations)
        jobs = [dataclasses.replace(j, age=j.age + 60.0, stint=j.stint + 60.0) for j in jobs]


def test_a_queue_holding_its_guarantee_needs_no_silo():
    """Two queues' jobs grow over rounds until each queue holds its guarantee in the
    answer without its rows: then neither silo is solved, and the rows reported are
    what they could be owed, which they hold. (With a restart budget a queue holding
    less than that now has its silo solved first: the property tests' case.)"""
    cl = Cluster.uniform({"a": (2, 8)})
    qs = QueueSet(queues=(Queue("A", guarantee={"a": 4}), Queue("B", guarantee={"a": 4})))
    jobs = [job(i, q, max_gpus=8) for q in "AB" for i in range(2)]
    sia = make_policy("sia")
    prev, warm = {}, None
    for _ in range(4):
        res = sia.optimize(cl, jobs, prev, queues=qs, warm=warm)
        prev, warm = dict(res.allocations), res.warm
    assert res.queues["A"]["a"] >= 4 and res.queues["B"]["a"] >= 4
    assert res.solver_stats["silo_solves"] == 0.0
    for q in "AB":
        activity, bound = res.rows[f"guarantee {q}/a"]
        assert bound == -4.0 and activity <= bound


def test_a_borrowing_row_joins_where_the_answer_goes_over_it():
    """Borrowing rows are left out while no queue is at its limit (none binds);
    where the answer without one takes a queue over its limit the row joins and
    the round is solved again, within the limit; a queue at its limit now has its
    row from the start."""
    cl = Cluster.uniform({"a": (2, 8)})
    qs = QueueSet(queues=(Queue("A", guarantee={"a": 4}, borrow_limit={"a": 2}),))
    jobs = [job(i, "A", max_gpus=8) for i in range(4)]
    sia = make_policy("sia")
    prev: dict = {}
    passes = []
    for _ in range(4):
        res = sia.optimize(cl, jobs, prev, queues=qs)
        check_round(cl, jobs, res)
        assert res.queues["A"]["a"] <= 6
        activity, bound = res.rows["borrow A/a"]
        assert activity <= bound
        passes.append(res.solver_stats["borrow_passes"])
        prev = dict(res.allocations)
    assert max(passes) == 2.0 and passes[-1] == 1.0  # (at its limit: the row from the start)


@pytest.mark.parametrize("solver", ["cvxpy-highs", "glpk_mi"])
def test_a_reference_solver_runs_rounds_with_guarantees_and_borrowing(solver):
    """A reference solve (CVXPY) has no prices: the rounds' bookkeeping of them (the
    borrowing rows left out, the warm start for the next round) takes that as none,
    and the rounds are those of the production solver, up to its gap."""
    cl = Cluster.uniform({"a": (2, 8)})
    qs = QueueSet(queues=(Queue("A", guarantee={"a": 4}, borrow_limit={"a": 2}),
                          Queue("B", guarantee={"a": 4})))
    jobs = [job(i, q, max_gpus=8) for q in "AB" for i in range(2)]
    ref, prod = make_policy("sia", {"solver": solver}), make_policy("sia")
    prev: dict = {}
    warm = None
    for _ in range(3):
        res = ref.optimize(cl, jobs, prev, queues=qs, warm=warm)
        check_round(cl, jobs, res)
        assert res.objective == pytest.approx(
            prod.optimize(cl, jobs, prev, queues=qs).objective, rel=1e-3)
        assert res.warm is not None and res.warm.prices is None and not res.warm.row_prices
        assert res.queues["A"]["a"] <= 6
        prev, warm = dict(res.allocations), res.warm
    assert res.queues["A"]["a"] >= 4 and res.queues["B"]["a"] >= 4
