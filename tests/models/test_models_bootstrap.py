"""Sia's bootstrapped throughput estimator and the job model the policy calls."""

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.models import bootstrap as bootstrap_module
from sia_grpc.models import estimator as estimator_module
from sia_grpc.models.bootstrap import (
    JobGoodputModel,
    ThroughputEstimator,
    evaluate_jobs,
    evaluate_many,
)
from sia_grpc.models.efficiency import GradParams
from sia_grpc.models.estimate_cache import CACHE, Entry, EstimateCache
from sia_grpc.models.goodput import GoodputEstimate
from sia_grpc.models.throughput import (
    PerfParams,
    compute_time,
    fit_perf_params,
    step_time,
    sync_time,
    throughput,
)

BSZ = np.array([8, 12, 16, 24, 32, 48, 64, 96, 128, 192])
# Ground truth of two GPU types; "fast" computes 3x faster, networks differ too.
SLOW = PerfParams(0.03, 0.003, 0.2, 0.02, 0.05, 0.004, 1.3)
FAST = PerfParams(0.01, 0.001, 0.05, 0.005, 0.02, 0.001, 1.6)
NODES = np.array([1, 1, 1, 1, 2, 2, 4])
REPS = np.array([1, 2, 4, 8, 8, 16, 32])


def _profile(est, gpu_type, truth):
    # A 1-GPU profile: step = T_sync at 1 replica, sync = its (tiny) network part.
    t_c = compute_time(truth, BSZ)
    step = sync_time(truth, 1, 1, BSZ)
    est.add_profile(gpu_type, BSZ, step, step - t_c)


def _observe(est, gpu_type, truth, configs):
    for n, r in configs:
        b = BSZ[::3]
        step = sync_time(truth, n, r, b)
        est.add_observation(gpu_type, n, r, b, 0, step, step - compute_time(truth, b))


def _estimator():
    est = ThroughputEstimator()
    _profile(est, "slow", SLOW)
    _profile(est, "fast", FAST)
    return est


def test_profiles_give_each_types_compute_model():
    est = _estimator()
    assert est.known_types == ("fast", "slow")
    for gpu_type, truth in (("slow", SLOW), ("fast", FAST)):
        got = est.throughput(gpu_type, 1, 1, BSZ, 0)
        np.testing.assert_allclose(got, throughput(truth, 1, 1, BSZ, 0), rtol=0.01)
    assert est.throughput("other", 1, 1, 32, 0) == 0.0  # not profiled


def test_before_multi_gpu_runs_scaling_is_linear():
    """(b): no network terms, so N GPUs give exactly N x the 1-GPU throughput."""
    est = _estimator()
    for gpu_type in est.known_types:
        one = est.throughput(gpu_type, 1, 1, BSZ[:, None], np.array([0, 2]))
        for n, r in zip(NODES, REPS, strict=True):
            many = est.throughput(gpu_type, n, r, BSZ[:, None], np.array([0, 2]))
            np.testing.assert_allclose(many, r * one, rtol=1e-12)


def test_multi_gpu_runs_on_one_type_project_onto_the_others():
    """(c): xput_B(N) = xput_B(1) / xput_A(1) * xput_A(N), A fitted with Pollux's model."""
    est = _estimator()
    configs = [(1, 2), (1, 4), (2, 8), (4, 16)]
    _observe(est, "slow", SLOW, configs)
    assert est.reference_type == "slow"
    # A itself: its own full fit, close to the truth, sublinear.
    a_n = est.throughput("slow", NODES, REPS, 32, 0)
    np.testing.assert_allclose(a_n, throughput(SLOW, NODES, REPS, 32, 0), rtol=0.02)
    assert a_n[-1] < 32 * a_n[0] * 0.9
    # B: projected from A's curve.
    b_n = est.throughput("fast", NODES, REPS, 32, 0)
    b_1 = est.throughput("fast", 1, 1, 32, 0)
    np.testing.assert_allclose(b_n, b_1 / a_n[0] * a_n, rtol=1e-12)
    # Also with accumulation.
    b = est.throughput("fast", 2, 8, 64, 3)
    want = est.throughput("fast", 1, 1, 64, 3) / est.throughput("slow", 1, 1, 64, 3) \
        * est.throughput("slow", 2, 8, 64, 3)
    assert b == pytest.approx(want, rel=1e-12)


def test_reference_type_is_most_observed_then_by_name():
    est = _estimator()
    _profile(est, "mid", SLOW)
    _observe(est, "slow", SLOW, [(1, 2)])
    _observe(est, "mid", SLOW, [(1, 4)])
    assert est.reference_type == "mid"  # tie on distinct configurations: by name
    _observe(est, "slow", SLOW, [(2, 8)])
    assert est.reference_type == "slow"


def test_own_multi_gpu_runs_replace_the_projection():
    """(d): once B has run multi-GPU, B's estimate is its own fit."""
    est = _estimator()
    _observe(est, "slow", SLOW, [(1, 2), (1, 4), (2, 8), (4, 16)])
    projected = est.throughput("fast", NODES, REPS, 32, 0)
    _observe(est, "fast", FAST, [(1, 2), (1, 8), (2, 16)])
    own = est.throughput("fast", NODES, REPS, 32, 0)
    # Within 4% of the truth (3 multi-GPU configurations, regularised fit); the
    # projection was off by up to 29% at 32 GPUs.
    np.testing.assert_allclose(own, throughput(FAST, NODES, REPS, 32, 0), rtol=0.04)
    assert np.max(np.abs(projected / own - 1)) > 0.2
    # Exactly the Pollux fit of B's own data.
    b = np.concatenate([BSZ] + [BSZ[::3]] * 3)
    n = np.concatenate([np.ones(10, int)] + [np.full(4, k) for k in (1, 1, 2)])
    r = np.concatenate([np.ones(10, int)] + [np.full(4, k) for k in (2, 8, 16)])
    fit = fit_perf_params(n, r, b, compute_time(FAST, b), sync_time(FAST, n, r, b))
    np.testing.assert_allclose(own, throughput(fit, NODES, REPS, 32, 0), rtol=1e-6)


def test_fits_are_cached_until_data_changes():
    est = _estimator()
    first = est.perf_params("slow")
    assert est.perf_params("slow") is first
    assert est.time_fn("fast") is est.time_fn("fast")
    v = est.version
    _observe(est, "slow", SLOW, [(1, 2)])
    assert est.version > v
    assert est.perf_params("slow") is not first


def test_repeated_measurements_are_averaged():
    a, b = ThroughputEstimator(), ThroughputEstimator()
    a.add_profile("t", [8, 16, 16], [0.1, 0.2, 0.4], [0.01, 0.01, 0.03])
    b.add_profile("t", [8, 16], [0.1, 0.3], [0.01, 0.02])
    np.testing.assert_allclose(a.perf_params("t").as_array(), b.perf_params("t").as_array(),
                               rtol=1e-6)


def test_rejects_bad_measurements():
    est = ThroughputEstimator()
    with pytest.raises(ValueError):
        est.add_profile("t", 8, 0.1, 0.2)  # sync longer than the step
    with pytest.raises(ValueError):
        est.add_observation("t", 2, 1, 8, 0, 0.2, 0.1)  # more nodes than replicas


def test_an_infinite_batch_size_is_refused():
    """An infinite batch passed the integer check (inf == round(inf)) and was stored
    as -2**63; it is refused like any batch that is no positive integer."""
    est = ThroughputEstimator()
    for bsz in (math.inf, [8, math.inf], np.array([math.inf])):
        with pytest.raises(ValueError, match="positive integers"):
            est.add_observation("t", 1, 1, bsz, 0, 0.2, 0.1)
    assert est.version == 0


_NUMBER = st.one_of(st.integers(-2, 40), st.floats(-1.0, 64.0), st.sampled_from(
    [math.nan, math.inf, -0.0, np.int32(4), np.int64(2), np.float32(0.25), np.float64(16.0)]))


@settings(max_examples=400, deadline=None)
@given(nodes=st.integers(-1, 4) | st.sampled_from([np.int64(2)]),
       reps=st.integers(-1, 8) | st.sampled_from([np.int32(4)]),
       bsz=_NUMBER, step=_NUMBER, sync=_NUMBER)
def test_one_plain_point_is_taken_as_its_one_element_arrays_are(nodes, reps, bsz, step, sync):
    """A point of plain numbers skips numpy (the controller adds one per report): the
    same journalled lists, or the same error, as the point given as arrays."""
    def add(*point):
        est = ThroughputEstimator()
        try:
            with np.errstate(all="ignore"):
                est.add_observation("t", *point)
        except ValueError as exc:
            return str(exc)
        return est.changes_since(0), {t: dict(d) for t, d in est._data.items()}

    plain = add(nodes, reps, bsz, 0, step, sync)
    arrays = add(np.array([nodes]), np.array([reps]), np.array([bsz]), 0,
                 np.array([step], dtype=float), np.array([sync], dtype=float))
    assert repr(plain) == repr(arrays)


def _job(est=None, **kw):
    args = dict(estimator=est or _estimator(), grad=GradParams(sqr=1.0, var=20.0),
                init_batch_size=64, max_batch_size=2048,
                local_bsz_limits={"slow": (8, 128), "fast": (8, 192)})
    args.update(kw)
    return JobGoodputModel(**args)


def test_job_model_evaluate():
    job = _job()
    est = job.evaluate("fast", NODES, REPS)
    assert len(est) == len(NODES)
    for f in ("goodput", "throughput", "batch_size", "atomic_bsz", "accum_steps"):
        assert getattr(est, f).shape == (len(NODES),)
    assert np.all(est.goodput > 0)
    np.testing.assert_array_equal(est.batch_size, REPS * est.atomic_bsz * (est.accum_steps + 1))
    assert np.all(est.goodput < est.throughput)  # efficiency < 1 above the initial batch
    # Unknown type, or known without local batch limits: all zero.
    for gpu_type in ("other",):
        z = job.evaluate(gpu_type, NODES, REPS)
        assert not np.any(z.goodput) and not np.any(z.batch_size)
    assert not np.any(_job(local_bsz_limits={"slow": (8, 128)}).evaluate("fast", NODES,
                                                                         REPS).goodput)
    # 8 x 32 replicas = 256 >= 64: feasible; 8 x 512 > 2048: infeasible.
    e = job.evaluate("fast", np.array([4, 64]), np.array([32, 512]))
    assert e.goodput[0] > 0 and e.goodput[1] == 0


def test_job_model_fixed_batch_is_throughput():
    job = _job()
    est = job.evaluate("slow", NODES, REPS, fixed_batch_size=256)
    np.testing.assert_array_equal(est.goodput, est.throughput)
    ok = REPS * 8 <= 256
    assert np.all(est.goodput[ok] > 0) and np.all(est.goodput[~ok] == 0)
    np.testing.assert_array_equal(est.batch_size[ok], 256)
    # Before any multi-GPU run the fixed-batch estimate scales with the replica count
    # as long as the micro-batch split stays the same (2 replicas x 128 vs 1 x 2 x 128).
    e1 = job.evaluate("slow", np.array([1]), np.array([1]), fixed_batch_size=128)
    e2 = job.evaluate("slow", np.array([1]), np.array([2]), fixed_batch_size=256)
    assert e2.throughput[0] == pytest.approx(2 * e1.throughput[0], rel=1e-12)


def test_job_model_caches_see_new_grad_and_new_data():
    job = _job()
    before = job.evaluate("fast", NODES, REPS)
    noisier = job.with_grad(GradParams(sqr=1.0, var=1000.0))
    after = noisier.evaluate("fast", NODES, REPS)
    assert np.all(after.batch_size >= before.batch_size)
    assert np.any(after.batch_size > before.batch_size)  # more noise: larger batches pay
    _observe(job.estimator, "slow", SLOW, [(1, 2), (1, 4), (2, 8), (4, 16)])
    projected = job.evaluate("fast", NODES, REPS)
    assert projected.throughput[-1] < before.throughput[-1]  # network costs now counted
    assert job.evaluate("fast", NODES, REPS).goodput.tolist() == projected.goodput.tolist()


def test_pickle_round_trip():
    job = _job()
    _observe(job.estimator, "slow", SLOW, [(1, 2), (2, 8)])
    want = job.evaluate("fast", NODES, REPS)
    copy = pickle.loads(pickle.dumps(job))
    got = copy.evaluate("fast", NODES, REPS)
    np.testing.assert_array_equal(got.goodput, want.goodput)
    est = pickle.loads(pickle.dumps(job.estimator))
    np.testing.assert_array_equal(est.throughput("fast", NODES, REPS, 32, 0),
                                  job.estimator.throughput("fast", NODES, REPS, 32, 0))


def test_invalid_job_model():
    with pytest.raises(ValueError):
        _job(init_batch_size=4096)
    with pytest.raises(ValueError):
        _job(local_bsz_limits={"slow": (0, 8)})


def test_step_time_of_projection_matches_definition():
    est = _estimator()
    _observe(est, "slow", SLOW, [(1, 2), (1, 4), (2, 8)])
    a = est.perf_params("slow")
    t = est.step_time("fast", 2, 8, 32, 1)
    own_1 = 2 * compute_time(est.perf_params("fast"), 32)
    want = own_1 * step_time(a, 2, 8, 32, 1) / step_time(a, 1, 1, 32, 1)
    assert t == pytest.approx(want, rel=1e-12)


# -- the process-wide estimate cache (models.estimate_cache) ------------------------------


def _batched(job, types=None):
    return evaluate_many([(job, tuple(types or ("fast",) * len(NODES)), NODES, REPS)])


def _fresh(job):
    """The estimate computed from scratch (the cache emptied first)."""
    CACHE.clear()
    return _batched(job)


def test_a_pickled_copy_finds_the_originals_estimates(monkeypatch: pytest.MonkeyPatch):
    """The controller pickles every job's model to its solver process each round; the
    cache is keyed so that the copy's rounds are warm (they were all cold when the
    cache lived on the model object)."""
    job = _job()
    want = _fresh(job)
    built = []
    real = bootstrap_module.batch_grid
    monkeypatch.setattr(bootstrap_module, "batch_grid",
                        lambda *a, **k: built.append(1) or real(*a, **k))
    got = _batched(pickle.loads(pickle.dumps(job)))
    assert built == []
    np.testing.assert_array_equal(got.goodput, want.goodput)


def test_a_changed_copy_does_not_take_the_originals_estimates():
    job = _job()
    copy = pickle.loads(pickle.dumps(job))
    assert copy.estimator.uid == job.estimator.uid
    _observe(copy.estimator, "fast", FAST, [(2, 8)])  # the copy learns alone
    _observe(job.estimator, "slow", SLOW, [(1, 4)])  # and so does the original
    assert copy.estimator.version == job.estimator.version
    assert copy.estimator.uid != job.estimator.uid
    for model in (job, copy):
        _batched(model)
    np.testing.assert_array_equal(_batched(copy).goodput, _fresh(copy).goodput)
    np.testing.assert_array_equal(_batched(job).goodput, _fresh(job).goodput)


def test_models_sharing_an_estimator_keep_their_own_bounds_and_statistics():
    job = _job()
    other = dataclasses.replace(job, max_batch_size=job.init_batch_size * 2,
                                grad=GradParams(sqr=1.0, var=1000.0))
    one, two = _batched(job), _batched(other)  # warm, in this order
    np.testing.assert_array_equal(one.batch_size, _fresh(job).batch_size)
    np.testing.assert_array_equal(two.batch_size, _fresh(other).batch_size)
    assert np.any(one.batch_size != two.batch_size)


@given(st.lists(st.sampled_from([(0, 0.5, 5.0), (0, 2.0, 50.0), (1, 0.5, 5.0), (1, 1.0, 1e3)]),
                min_size=1, max_size=12))
@settings(max_examples=25, deadline=None)
def test_cached_estimates_equal_fresh_ones_whatever_the_order(asks):
    """Jobs (two estimators) asked in any order at any statistics: every answer is
    what an empty cache would give."""
    jobs = [_job(), _job()]
    for k, sqr, var in asks:
        model = jobs[k].with_grad(GradParams(sqr=sqr, var=var))
        got = _batched(model, ("fast", "slow") * 3 + ("fast",))
        CACHE.clear()
        want = _batched(model, ("fast", "slow") * 3 + ("fast",))
        for f in ("goodput", "batch_size", "atomic_bsz", "accum_steps"):
            np.testing.assert_array_equal(getattr(got, f), getattr(want, f))


def test_the_cache_keeps_to_its_byte_bound():
    cache = EstimateCache(max_bytes=10_000)
    for k in range(50):
        cache.put(k, Entry(GoodputEstimate.zeros(10)))  # 5 arrays x 80 B
    assert cache.nbytes <= 10_000 and len(cache) == 25
    assert cache.get(0) is None and cache.get(49) is not None


def test_a_deep_copy_is_a_new_estimator():
    est = _estimator()
    assert copy.deepcopy(est).uid != est.uid
    assert pickle.loads(pickle.dumps(est)).uid == est.uid


def test_a_pickled_copy_refits_only_the_type_whose_data_changed(monkeypatch: pytest.MonkeyPatch):
    """What the controller's solver process sees each round: the job's estimator
    arrives without fits, one type having new observations."""
    est = _estimator()
    _observe(est, "slow", SLOW, [(1, 2), (2, 8)])
    _observe(est, "fast", FAST, [(1, 2), (2, 8)])
    for t in ("slow", "fast"):
        est.perf_params(t)
    _observe(est, "fast", FAST, [(1, 4)])  # this round's telemetry
    fitted = []
    real = estimator_module.fit_perf_params
    monkeypatch.setattr(estimator_module, "fit_perf_params",
                        lambda *a: fitted.append(1) or real(*a))
    copy_ = pickle.loads(pickle.dumps(est))
    copy_._fits.clear()  # as the controller's copy arrives
    got = {t: copy_.perf_params(t) for t in ("slow", "fast")}
    assert len(fitted) == 1
    assert got == {t: est.perf_params(t) for t in ("slow", "fast")}


def test_a_copy_brought_up_to_date_by_the_changes_is_the_original():
    """What the controller's solver process holds from the last round, brought to this
    round's version by the changes since (`changes_since`, `replay`): the same data to
    the bit, the same uid and per-type versions (so its fits and estimates are found),
    and the changes are not kept where they have gone beyond what the journal keeps."""
    est = _estimator()
    _observe(est, "slow", SLOW, [(1, 2), (2, 8)])
    held = pickle.loads(pickle.dumps(est))  # the worker's copy of the last round
    assert held._journal == []  # (copies do not carry the journal)
    was = est.version
    _observe(est, "fast", FAST, [(1, 4), (2, 8)])
    _observe(est, "slow", SLOW, [(1, 2)])
    changes = est.changes_since(was)
    assert changes is not None and len(changes) == est.version - was
    held.replay(changes, est.version)
    assert (held.uid, held.version) == (est.uid, est.version)
    assert held._data == est._data and held._type_versions == est._type_versions
    assert held.perf_params("fast") == est.perf_params("fast")
    assert est.changes_since(est.version) == ()
    with pytest.raises(ValueError):
        held.replay(changes, est.version)  # (it is past the version they start from)
    for _ in range(estimator_module._JOURNAL_KEPT + 1):
        _observe(est, "fast", FAST, [(1, 2)])
    assert est.changes_since(was) is None


def test_entries_unused_for_some_rounds_go():
    """A long-running controller's solver process: finished jobs' estimates do not
    pile up until the byte bound."""
    cache = EstimateCache(keep=2)
    cache.put("done", Entry(GoodputEstimate.zeros(1)))
    cache.put("running", Entry(GoodputEstimate.zeros(1)))
    for _ in range(3):
        cache.new_round()
        assert cache.get_many(["running"])[0] is not None
    assert cache.get("done") is None and len(cache) == 1
    assert cache.nbytes == Entry(GoodputEstimate.zeros(1)).nbytes


# -- the model's memo of its last estimate (evaluate_jobs with row keys) -----------------


def _keyed(job, key=b"rows", types=None):
    types = tuple(types or ("fast",) * len(NODES))
    return evaluate_jobs([job], [key], lambda k: (types, NODES, REPS))


def test_the_memo_serves_an_unchanged_job_without_the_cache():
    job = _job()
    want = _fresh(job)
    _keyed(job)
    CACHE.clear()  # only the memo can answer now
    found = CACHE.found
    got = _keyed(job)
    assert CACHE.found == found + 1 and len(CACHE) == 0
    np.testing.assert_array_equal(got.goodput, want.goodput)


@pytest.mark.parametrize("change", ["rows", "observation", "statistics"])
def test_the_memo_is_not_used_once_its_job_changed(change):
    """Whatever the estimate depends on, changed, gives the estimate from scratch:
    other rows, new data for the estimator, new gradient statistics."""
    job = _job()
    _keyed(job, types=("fast",) * len(NODES))
    types = ("fast",) * len(NODES)
    key = b"rows"
    if change == "rows":
        types, key = ("slow",) * len(NODES), b"other rows"
    elif change == "observation":
        _observe(job.estimator, "fast", FAST, [(2, 8)])
    else:  # (a new model object: given the old one's memo, to show the check)
        memo = job.__dict__["_memo"]
        job = job.with_grad(GradParams(sqr=1.0, var=500.0))
        object.__setattr__(job, "_memo", memo)
    got = _keyed(job, key, types)
    CACHE.clear()
    want = evaluate_many([(job, types, NODES, REPS)])
    np.testing.assert_array_equal(got.goodput, want.goodput)
    np.testing.assert_array_equal(got.batch_size, want.batch_size)


def test_a_pickled_model_leaves_its_memo_behind():
    job = _job()
    _keyed(job)
    assert "_memo" in job.__dict__
    assert "_memo" not in pickle.loads(pickle.dumps(job)).__dict__


def test_many_jobs_of_mixed_types_in_one_pass_equal_each_row_alone():
    """`evaluate_many` stacks every job's rows (their types' time plans built once per
    job and type, `_stacked_plans`): each row equals its job's own `evaluate` of that
    type, across jobs with different estimators, row orders, a type with no estimate
    (zero) and a type one job has multi-GPU data for and the other projects."""
    CACHE.clear()
    measured = _estimator()
    _observe(measured, "fast", FAST, [(1, 4), (2, 8)])
    jobs = [_job(), _job(measured), _job(local_bsz_limits={"fast": (8, 192)})]
    pattern = [("slow", "fast", "none", "fast", "slow", "fast", "slow"),
               ("fast",) * 3 + ("slow",) * 4, ("none", "slow", "fast") * 2 + ("fast",)]
    items = [(job, types, NODES, REPS) for job, types in zip(jobs, pattern, strict=True)]
    got = evaluate_many(items)
    k = 0
    for job, types, nodes, reps in items:
        for i, t in enumerate(types):
            alone = job.evaluate(t, nodes[i:i + 1], reps[i:i + 1])
            for f in ("goodput", "throughput", "batch_size", "atomic_bsz", "accum_steps"):
                assert getattr(got, f)[k] == pytest.approx(float(getattr(alone, f)[0]),
                                                           rel=1e-12, abs=0.0), (f, k, t)
            k += 1
    assert k == len(got)
    assert np.all(got.goodput[[2, 14, 17]] == 0)  # ("none": no profile, no estimate)
