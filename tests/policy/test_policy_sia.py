"""Sia's policy on hand-checkable goodput models: the matrix, the restart factor,
the scaling rules, job kinds, and invariants over rounds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.policy import (
    Adaptivity,
    Cluster,
    Config,
    FifoPolicy,
    GavelPolicy,
    PolicyJob,
    PolluxPolicy,
    SiaConfig,
    SiaPolicy,
    make_policy,
    paper_hetero_cluster,
)
from sia_grpc.policy.candidates import candidate_index, estimate
from sia_grpc.policy.sia import (
    job_restart_factor,
    normalised_goodput,
    objective_values,
    restart_factor,
)
from sia_grpc.policy.types import JobAllocation


@dataclass(frozen=True)
class Est:
    goodput: np.ndarray
    throughput: np.ndarray
    batch_size: np.ndarray
    atomic_bsz: np.ndarray
    accum_steps: np.ndarray


@dataclass(frozen=True)
class LinearModel:
    """goodput = speed[type] · replicas^exponent; batch = 32 per replica."""

    speed: dict[str, float]
    exponent: float = 1.0

    def evaluate(self, gpu_type, num_nodes, num_replicas, *, fixed_batch_size=None):
        r = np.asarray(num_replicas, dtype=float)
        g = self.speed.get(gpu_type, 0.0) * r**self.exponent
        bsz = np.full_like(r, fixed_batch_size) if fixed_batch_size else 32 * r
        return Est(g, g, bsz, np.ceil(bsz / r), np.zeros_like(r))


def candidate_configs(cluster: Cluster, job: PolicyJob, current: Config | None, *,
                      max_scale_up: float = 2.0, scale_rules: bool = True) -> list[Config]:
    """One job's candidate configurations (`candidate_index` for one job)."""
    _, index = candidate_index(cluster, [job], [current], max_scale_up=max_scale_up,
                                     scale_rules=scale_rules)
    return [cluster.configs[k] for k in index]


def job(job_id: str, speed: dict[str, float], **kw) -> PolicyJob:
    return PolicyJob(job_id=job_id, model=LinearModel(speed, kw.pop("exponent", 1.0)),
                     age=kw.pop("age", 3600.0), **kw)


SMALL = Cluster.uniform({"fast": (1, 4), "slow": (2, 4)})


def test_restart_factor_by_hand():
    assert restart_factor(1000, 0, 100) == pytest.approx(1000 / 1100)
    assert restart_factor(1000, 2, 100) == pytest.approx(800 / 1100)
    assert restart_factor(100, 5, 100) == 0.0  # more time lost than lived: never restart
    assert restart_factor(0, 0, 0) == 1.0


def test_restart_factor_horizons_by_hand():
    # Age 1,000 s, 2 restarts of S = 100 s; half done in 600 s of running: R = 600 s.
    j = job("j", {"a": 1.0}, age=1000.0, num_restarts=2, restart_cost=100.0, progress=0.5,
            attained={"a": 600.0})
    assert job_restart_factor(j, "age") == pytest.approx(800 / 1100)
    assert job_restart_factor(j, "lifetime") == pytest.approx(1400 / 1700)
    assert job_restart_factor(j, "remaining") == pytest.approx(600 / 700)  # past: sunk
    assert job_restart_factor(j, "least") == pytest.approx(800 / 1100)
    # Near its end (R = 900 · 0.1 / 0.9 = 100 s) the remaining run is the cautious one.
    near = dataclasses.replace(j, progress=0.9, attained={"a": 900.0})
    assert job_restart_factor(near, "least") == pytest.approx(100 / 200)
    # No progress reported: R unknown, the age stands in.
    assert job_restart_factor(dataclasses.replace(j, progress=0.0), "remaining") == \
        pytest.approx(800 / 1100)


def test_normalised_goodput_and_objective_by_hand():
    cl = Cluster.uniform({"a": (1, 2)})
    table = estimate(cl, [job("j", {"a": 50.0}, exponent=np.log2(1.6))],
                     np.array([0, 2]), np.array([0, 1]))
    assert table.goodput == pytest.approx([50.0, 80.0])
    g = normalised_goodput(table, np.array([1.0]), clip=3000)
    assert g == pytest.approx([1.0, 1.6])
    assert normalised_goodput(table, np.array([2.0]), clip=3.0) == pytest.approx([2.0, 3.0])
    cfg = SiaConfig(p=-0.5)
    vals = objective_values(g, np.array([False, True]), np.array([0.25, 0.25]), cfg)
    assert vals == pytest.approx([-1.0, -(0.25 * 1.6) ** -0.5])
    assert objective_values(g, np.array([False, False]), np.ones(2), SiaConfig(p=0.5)) == \
        pytest.approx([1.0, 1.6**0.5])


def test_config_rejects_bad_parameters():
    with pytest.raises(ValueError, match="p:"):
        SiaConfig(p=0)
    with pytest.raises(ValueError, match="lambda_"):
        SiaConfig(lambda_=-1)


def test_new_job_starts_at_minimum_and_doubles_at_most():
    cl = paper_hetero_cluster()
    j = job("j", {"aws": 1, "rtx": 2, "dgx-ext": 4}, min_gpus=1)
    assert {c.num_gpus for c in candidate_configs(cl, j, None)} == {1}
    cur = Config("rtx", 1, 4)
    counts = {c.num_gpus for c in candidate_configs(cl, j, cur)}
    assert max(counts) == 8 and min(counts) == 1
    j2 = dataclasses.replace(j, min_gpus=2)
    assert {c.num_gpus for c in candidate_configs(cl, j2, None)} == {2}
    assert min(c.num_gpus for c in candidate_configs(cl, j2, cur)) == 2


def test_bounds_types_and_hybrid_replicas():
    cl = paper_hetero_cluster()
    j = job("j", {"aws": 1, "rtx": 1}, allowed_types=frozenset({"rtx"}), max_gpus=8)
    confs = candidate_configs(cl, j, Config("rtx", 1, 8))
    assert {c.gpu_type for c in confs} == {"rtx"} and max(c.num_gpus for c in confs) == 8
    h = job("h", {"rtx": 1, "dgx-ext": 1}, pipeline_gpus=2)
    confs = candidate_configs(cl, h, Config("rtx", 1, 4))
    assert confs and all(c.num_gpus % 2 == 0 for c in confs)
    res = SiaPolicy().optimize(cl, [h], {})
    assert res.allocations["h"].config.num_gpus == 2 and res.allocations["h"].num_replicas == 1


def test_single_job_takes_fastest_type():
    res = SiaPolicy().optimize(SMALL, [job("a", {"fast": 3, "slow": 1})], {})
    assert res.allocations["a"].config == Config("fast", 1, 1)
    assert res.reasons["a"].startswith("started on 1 fast")


def test_two_jobs_split_the_fast_type_by_relative_speedup():
    # Job a gains 4x on fast, job b only 1.5x: a gets the single fast GPU.
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    jobs = [job("a", {"fast": 4, "slow": 1}), job("b", {"fast": 1.5, "slow": 1})]
    res = SiaPolicy().optimize(cl, jobs, {})
    assert res.allocations["a"].config.gpu_type == "fast"
    assert res.allocations["b"].config.gpu_type == "slow"


def test_restart_factor_keeps_a_young_job_in_place():
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    prev = {"a": JobAllocation(Config("slow", 1, 1), gpus=(), goodput=1.0)}
    young = job("a", {"fast": 1.2, "slow": 1}, age=10.0, restart_cost=100.0)
    assert SiaPolicy().optimize(cl, [young], prev).allocations["a"].config.gpu_type == "slow"
    old = dataclasses.replace(young, age=100 * 3600.0)
    assert SiaPolicy().optimize(cl, [old], prev).allocations["a"].config.gpu_type == "fast"


def rounds_alone(policy, cluster, j, rounds: int = 5) -> list[int]:
    """A lone job's GPUs round after round, a minute apart (0.2% of its work done
    each minute, as a long job's would be)."""
    prev, counts, restarts = {}, [], 0
    for r in range(rounds):
        age = 60.0 * (r + 1)
        cur = dataclasses.replace(j, age=age, num_restarts=restarts, progress=0.002 * (r + 1),
                                  attained={"rtx": age})
        a = policy.optimize(cluster, [cur], prev).allocations["a"]
        restarts += int(bool(prev) and a.gpus != prev["a"].gpus)
        counts.append(a.config.num_gpus)
        prev = {"a": a}
    return counts


def test_a_lone_job_grows_onto_an_idle_cluster_in_consecutive_rounds():
    """Regression (defect: an adaptive job alone on 10 idle GPUs stayed on 1-2 of them
    for ~20 minutes). The cause is Sia's restart factor: a young job weighs a restart
    against its short life so far. `grow_into_idle` lets a running job grow onto GPUs
    the ILP leaves idle when the restart is small against its expected whole life."""
    from sia_grpc.models.profiles import job_model_from_artifact

    cl = Cluster.uniform({"rtx": (2, 8)})
    lone = PolicyJob(job_id="a", model=job_model_from_artifact("cifar10", gpu_types=("rtx",)),
                     max_gpus=16, restart_cost=50.0)
    paper = SiaPolicy(SiaConfig(grow_into_idle=False))
    assert rounds_alone(paper, cl, lone) == [1, 1, 2, 2, 2]
    grow = SiaPolicy()  # (the default)
    assert rounds_alone(grow, cl, lone)[:4] == [1, 2, 4, 8]  # doubling, every round
    # A (short) job near its end saves less than the restart costs: it stays.
    prev = {"a": grow.optimize(cl, [lone], {}).allocations["a"]}
    near_end = dataclasses.replace(lone, age=120.0, progress=0.99, attained={"rtx": 120.0})
    assert grow.optimize(cl, [near_end], prev).allocations["a"].config.num_gpus == 1


def test_growing_into_idle_gpus_takes_none_from_other_jobs():
    cl = Cluster.uniform({"fast": (1, 4)})
    jobs = [job(k, {"fast": 1.0}, exponent=0.9, restart_cost=50.0, age=60.0, progress=0.01,
                attained={"fast": 60.0}) for k in "ab"]
    prev = {j.job_id: a for j, a in zip(
        jobs, SiaPolicy().optimize(cl, jobs, {}).allocations.values(), strict=True)}
    plain = SiaPolicy(SiaConfig(grow_into_idle=False)).optimize(cl, jobs, prev)
    grown = SiaPolicy().optimize(cl, jobs, prev)
    total = sum(a.config.num_gpus for a in grown.allocations.values())
    assert total <= 4 and set(grown.allocations) == set(plain.allocations)
    for k in "ab":
        assert grown.allocations[k].config.num_gpus >= plain.allocations[k].config.num_gpus


def test_rigid_job_never_changes_count_and_strong_scaling_keeps_batch():
    cl = paper_hetero_cluster()
    rigid = job("r", {"aws": 1, "rtx": 2, "dgx-ext": 3}, adaptivity=Adaptivity.RIGID,
                num_gpus=4, batch_size=256)
    strong = job("s", {"aws": 1, "rtx": 2, "dgx-ext": 3}, adaptivity=Adaptivity.STRONG_SCALING,
                 batch_size=512)
    policy = SiaPolicy()
    prev: dict[str, JobAllocation] = {}
    for _ in range(5):
        res = policy.optimize(cl, [rigid, strong], prev)
        assert res.allocations["r"].config.num_gpus == 4
        assert res.allocations["r"].batch_size == 256
        assert res.allocations["s"].batch_size == 512
        prev = dict(res.allocations)
    assert prev["s"].config.num_gpus > 1  # strong-scaling jobs do scale


def test_job_with_no_estimate_waits_with_a_reason():
    res = SiaPolicy().optimize(SMALL, [job("x", {"other": 1})], {})
    assert "x" not in res.allocations
    assert res.reasons["x"].startswith("waiting: no allowed GPU type")


@pytest.mark.parametrize("name", ["sia", "pollux", "gavel", "fifo"])
def test_every_policy_respects_capacity_over_rounds(name):
    cl = paper_hetero_cluster()
    rng = np.random.default_rng(7)
    jobs = [job(f"j{i}", {"aws": 1.0, "rtx": float(rng.uniform(1, 3)),
                          "dgx-ext": float(rng.uniform(2, 6))},
                exponent=float(rng.uniform(0.6, 1.0)), submit_time=float(i),
                num_gpus=int(rng.choice([1, 2, 4])), batch_size=128)
            for i in range(30)]
    policy = make_policy(name)
    prev: dict[str, JobAllocation] = {}
    for _ in range(6):
        res = policy.optimize(cl, jobs, prev)
        used = {t: 0 for t in cl.gpu_types}
        seen = set()
        for a in res.allocations.values():
            used[a.config.gpu_type] += a.config.num_gpus
            assert len(a.gpus) == a.config.num_gpus
            assert not seen & set(a.gpus)
            seen |= set(a.gpus)
            assert all(cl.node(g.node).gpu_type == a.config.gpu_type for g in a.gpus)
        assert all(used[t] <= cl.capacity[t] for t in cl.gpu_types)
        prev = dict(res.allocations)
    assert len(prev) > 0


def test_sia_matches_reference_solver_objective():
    cl = paper_hetero_cluster()
    rng = np.random.default_rng(3)
    jobs = [job(f"j{i}", {"aws": 1.0, "rtx": float(rng.uniform(1, 3)),
                          "dgx-ext": float(rng.uniform(2, 6))},
                exponent=float(rng.uniform(0.5, 1.0)), age=float(rng.uniform(100, 9000)))
            for i in range(40)]
    prev: dict[str, JobAllocation] = {}
    prod, ref = SiaPolicy(), SiaPolicy(SiaConfig(solver="glpk_mi"))
    for _ in range(4):
        a, b = prod.optimize(cl, jobs, prev), ref.optimize(cl, jobs, prev)
        assert a.objective == pytest.approx(b.objective, rel=1e-4)
        prev = dict(a.allocations)


def test_pollux_ignores_gpu_type_differences():
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    # Sia sends the job that gains most to the fast GPU; Pollux cannot tell.
    jobs = [job("a", {"fast": 4, "slow": 1}), job("b", {"fast": 1.5, "slow": 1})]
    res = PolluxPolicy().optimize(cl, jobs, {})
    assert set(res.allocations) == {"a", "b"}
    assert res.objective == pytest.approx(-2.0)  # both see speedup 1 → (1)^-1 each


def test_pollux_starts_a_waiting_job_before_growing_a_running_one():
    """Regression: with Sia's λ = 1.1 at p = −1 (every job's 1-GPU value −1),
    starting a job was worth 0.1 and doubling a running one 0.5, so the baseline
    queued jobs behind growing ones. Pollux's ε = 1e-3 makes a left-out job
    cost 1000: both jobs run."""
    cl = Cluster.uniform({"x": (1, 2)})
    prev = {"a": JobAllocation(Config("x", 1, 1), gpus=(), goodput=1.0)}
    jobs = [job("a", {"x": 1}), job("b", {"x": 1})]
    res = PolluxPolicy().optimize(cl, jobs, prev)
    assert {n: a.config.num_gpus for n, a in res.allocations.items()} == {"a": 1, "b": 1}
    old = PolluxPolicy(SiaConfig(p=-1.0, lambda_=1.1, hold_restoring=False))
    assert {n: a.config.num_gpus for n, a in old.optimize(cl, jobs, prev).allocations.items()} \
        == {"a": 2}


def test_a_restoring_job_keeps_its_allocation():
    """As the authors' simulator does for Sia (preserve_ckpt_allocs): a job still
    paying its restore delay is not moved, even when moving it would win."""
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    prev = {"a": JobAllocation(Config("slow", 1, 1), gpus=(), goodput=1.0)}
    old = job("a", {"fast": 4, "slow": 1}, age=100 * 3600.0)
    assert SiaPolicy().optimize(cl, [old], prev).allocations["a"].config.gpu_type == "fast"
    restoring = dataclasses.replace(old, restoring=True)
    res = SiaPolicy().optimize(cl, [restoring], prev)
    assert res.allocations["a"].config == Config("slow", 1, 1)
    assert "a" not in res.restarted
    off = SiaPolicy(SiaConfig(hold_restoring=False))
    assert off.optimize(cl, [restoring], prev).allocations["a"].config.gpu_type == "fast"
    # Kept even when its GPUs would serve a newcomer better (it scales poorly).
    two = Cluster.uniform({"x": (1, 2)})
    held = {"a": JobAllocation(Config("x", 1, 2), gpus=(), goodput=1.0)}
    a = job("a", {"x": 1}, exponent=0.1, restoring=True)
    res = SiaPolicy().optimize(two, [a, job("b", {"x": 1})], held)
    assert set(res.allocations) == {"a"} and res.allocations["a"].config.num_gpus == 2
    free = SiaPolicy().optimize(two, [dataclasses.replace(a, restoring=False),
                                      job("b", {"x": 1})], held)
    assert set(free.allocations) == {"a", "b"}
    # A job that is not running is never held (nothing to keep).
    new = SiaPolicy().optimize(cl, [job("c", {"fast": 4, "slow": 1}, restoring=True)], {})
    assert new.allocations["c"].config.gpu_type == "fast"


def test_a_pinned_job_keeps_its_allocation_whatever_the_settings():
    """The controller's early rounds pin running jobs: only idle GPUs are handed out."""
    cl = Cluster.uniform({"fast": (1, 1), "slow": (1, 1)})
    prev = {"a": JobAllocation(Config("slow", 1, 1), gpus=(), goodput=1.0)}
    a = job("a", {"fast": 4, "slow": 1}, age=100 * 3600.0)
    off = SiaPolicy(SiaConfig(hold_restoring=False))
    assert off.optimize(cl, [a], prev).allocations["a"].config.gpu_type == "fast"
    res = off.optimize(cl, [dataclasses.replace(a, pinned=True), job("b", {"fast": 1})], prev)
    assert res.allocations["a"].config == Config("slow", 1, 1) and "a" not in res.restarted
    assert res.allocations["b"].config.gpu_type == "fast"


def test_a_required_job_gets_gpus_even_when_sharing_them_loses_value():
    """Profiling slots: the controller's 1-GPU stand-ins must be placed."""
    cl = Cluster.uniform({"x": (1, 2)})
    prev = {"a": JobAllocation(Config("x", 1, 2), gpus=(), goodput=1.0)}
    a = job("a", {"x": 1}, age=100 * 3600.0)
    slot = job("slot", {"x": 1}, adaptivity=Adaptivity.RIGID, num_gpus=1, batch_size=128)
    assert set(SiaPolicy().optimize(cl, [a, slot], prev).allocations) == {"a"}
    res = SiaPolicy().optimize(cl, [a, dataclasses.replace(slot, required=True)], prev)
    assert res.allocations["slot"].config == Config("x", 1, 1)
    assert res.allocations["a"].config == Config("x", 1, 1)


def test_gavel_and_fifo_run_jobs_rigidly():
    cl = paper_hetero_cluster()
    jobs = [job("a", {"aws": 1, "rtx": 2, "dgx-ext": 4}, num_gpus=4, batch_size=128,
                submit_time=0.0),
            job("b", {"aws": 1, "rtx": 2, "dgx-ext": 4}, num_gpus=16, batch_size=512,
                submit_time=1.0)]
    for policy in (GavelPolicy(), FifoPolicy()):
        res = policy.optimize(cl, jobs, {})
        assert res.allocations["a"].config.num_gpus == 4
        assert res.allocations["b"].config.num_gpus == 16


def test_fifo_is_non_preemptive_and_strict():
    cl = Cluster.uniform({"t": (1, 4)})
    a = job("a", {"t": 1}, num_gpus=4, batch_size=64, submit_time=0.0)
    b = job("b", {"t": 1}, num_gpus=2, batch_size=64, submit_time=1.0)
    res = FifoPolicy().optimize(cl, [a, b], {})
    assert set(res.allocations) == {"a"} and res.reasons["b"].startswith("waiting")
    c = job("c", {"t": 1}, num_gpus=1, batch_size=64, submit_time=-1.0)
    res2 = FifoPolicy().optimize(cl, [a, b, c], dict(res.allocations))
    assert set(res2.allocations) == {"a"}  # c is earlier but a keeps its GPUs


def test_unknown_policy_name_is_a_clear_error():
    with pytest.raises(ValueError, match="policy: unknown 'nope'"):
        make_policy("nope")


def test_unknown_solver_is_rejected_when_configured():
    with pytest.raises(ValueError, match="solver: unknown 'cplex'"):
        SiaConfig(solver="cplex")


def test_finished_jobs_release_gpus_and_do_not_count_as_restarts():
    cl = Cluster.uniform({"t": (1, 4)})
    a, b = job("a", {"t": 1}), job("b", {"t": 1})
    first = SiaPolicy().optimize(cl, [a, b], {})
    assert set(first.allocations) == {"a", "b"}
    # a finished: it is no longer active, but last round's allocation still lists it.
    second = SiaPolicy().optimize(cl, [b], dict(first.allocations))
    assert "a" not in second.restarted and "a" not in second.allocations
    assert second.allocations["b"].config.num_gpus == 2  # b doubles into a's GPUs


def _bounds_of_one(cluster, j, cur, max_scale_up, start_scale):
    """The scaling rules for one job, as docs/architecture.md states them."""
    if j.adaptivity is Adaptivity.RIGID:
        n = max(j.num_gpus, j.pipeline_gpus)
        return n, n, cluster.total_gpus
    lo = max(j.min_gpus, j.pipeline_gpus)
    limit = j.max_gpus if j.max_gpus is not None else cluster.total_gpus
    grown = (max(int(lo * start_scale), lo) if cur is None
             else max(int(cur.num_gpus * max_scale_up), lo))
    return lo, min(limit, grown), limit


@given(st.lists(st.tuples(st.sampled_from(list(Adaptivity)), st.integers(1, 16),
                          st.sampled_from([1, 2, 4]), st.integers(1, 8),
                          st.one_of(st.none(), st.integers(1, 64)),
                          st.one_of(st.none(), st.sampled_from([1, 2, 4, 8, 16]))),
                min_size=1, max_size=20),
       st.sampled_from([1.0, 1.5, 2.0, 4.0]), st.sampled_from([1.0, 2.5, 4.0]))
@settings(max_examples=60, deadline=None)
def test_count_bounds_of_many_jobs_are_each_jobs_own(specs, max_scale_up, start_scale):
    """The vectorised bounds equal the rule applied job by job."""
    from sia_grpc.policy.candidates import count_bounds
    cl = paper_hetero_cluster()
    jobs, current = [], []
    for k, (ad, num, pipe, lo, hi, cur) in enumerate(specs):
        kw = dict(min_gpus=lo, max_gpus=None if hi is None else max(hi, lo))
        if ad is not Adaptivity.ADAPTIVE:
            kw["batch_size"] = 64
        if ad is Adaptivity.RIGID:
            kw = dict(num_gpus=-(-num // pipe) * pipe, batch_size=64)
        jobs.append(job(f"j{k}", {"rtx": 1}, adaptivity=ad, pipeline_gpus=pipe, **kw))
        current.append(None if cur is None else Config("rtx", 1, cur))
    got = count_bounds(cl, jobs, current, max_scale_up=max_scale_up, start_scale=start_scale)
    want = [_bounds_of_one(cl, j, c, max_scale_up, start_scale)
            for j, c in zip(jobs, current, strict=True)]
    assert got.tolist() == [list(w) for w in want]


def test_an_allocation_made_fast_is_the_constructors():
    from sia_grpc.policy.cluster import GpuId
    args = (Config("rtx", 1, 2), (GpuId("n0", 0), GpuId("n0", 1)), 2, 256, 64, 1, 12.5)
    fast, slow = JobAllocation.of(*args), JobAllocation(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.batch_size = 1  # type: ignore[misc]


def test_a_round_starts_from_the_last_rounds_prices_and_answers_within_the_gap():
    """A round leaves its capacity prices in its warm start; the next one, given it,
    tries them first (at a size that takes column generation) and answers within the
    solver's gap of the same round solved from nothing."""
    from sia_grpc.bench.scenarios import sample_jobs
    from sia_grpc.policy.cluster import paper_hetero_cluster

    cluster = paper_hetero_cluster(32)  # 2,048 GPUs
    jobs = sample_jobs(np.random.default_rng(0), 2000, cluster)
    policy = SiaPolicy()
    last, previous = None, {}
    for _ in range(3):  # (the first round starts every job; a few more settle them)
        last = policy.optimize(cluster, jobs, previous, **({"warm": last.warm} if last else {}))
        previous = dict(last.allocations)
        jobs = [dataclasses.replace(j, age=j.age + policy.round_duration,
                                    num_restarts=j.num_restarts + (j.job_id in last.restarted))
                for j in jobs]
    assert last.warm is not None and len(last.warm.prices) == len(cluster.gpu_types)
    warm = policy.optimize(cluster, jobs, previous, warm=last.warm)
    cold = policy.optimize(cluster, jobs, previous)
    assert warm.solver_stats["hinted"] == 1.0 and cold.solver_stats["hinted"] == 0.0
    assert warm.objective >= cold.objective - 1e-4 * max(1.0, abs(cold.objective))
