"""Goodput: batch-size choice, accumulation arithmetic, fixed batches."""

import numpy as np
import pytest

from sia_grpc.models.efficiency import GradParams
from sia_grpc.models.goodput import GoodputFunction, split_local_batch
from sia_grpc.models.throughput import PerfParams, step_time

P = PerfParams(alpha_c=0.1, beta_c=0.01, alpha_n=0.2, beta_n=0.05, alpha_r=0.1, beta_r=0.02,
               gamma=1.0)


def test_split_local_batch():
    atomic, accum = split_local_batch(np.array([100, 64, 32, 33, 5]), 32)
    np.testing.assert_array_equal(accum, [3, 1, 0, 1, 0])
    np.testing.assert_array_equal(atomic, [25, 32, 32, 17, 5])
    atomic, accum = split_local_batch(np.array([100.0, 64.0]), 32, accumulation=False)
    np.testing.assert_array_equal(accum, [0, 0])
    np.testing.assert_array_equal(atomic, [100, 64])
    # Float noise in a batch computed as e.g. 3 * 32 / 3 must not add a micro-batch.
    atomic, accum = split_local_batch(np.array([64.00000000001]), 32)
    assert (atomic[0], accum[0]) == (32, 1)


def test_evaluate_is_throughput_times_efficiency():
    f = GoodputFunction(P, GradParams(sqr=1.0, var=3.0), init_batch_size=10)
    # 4 replicas x 10 x (1 + 1) = 80 samples: S = 8, efficiency = 4 / (3 + 8) = 4/11.
    xput = 80 / (0.2 + 0.34)
    assert f.throughput(1, 4, 10, 1) == pytest.approx(xput)
    assert f.efficiency(80) == pytest.approx(4 / 11)
    assert f.evaluate(1, 4, 10, 1) == pytest.approx(xput * 4 / 11)
    assert f(1, 4, 10, 1) == pytest.approx(xput * 4 / 11)


def test_optimize_finds_analytic_optimum():
    # One replica, no network: goodput(B) = B / (a + c B) * (v + s) / (v + s B), with
    # init batch 1, is maximised at B* = sqrt(a v / (c s)) = 100 for these values. The
    # 50 geometric samples from 1 to 10^4.9 are 10^(k / 10), so 100 is one of them.
    perf = PerfParams(1.0, 0.01, 1e-8, 1e-8, 1e-8, 1e-8, 1.0)
    f = GoodputFunction(perf, GradParams(sqr=1.0, var=100.0), init_batch_size=1)
    goodput, atomic, accum = f.optimize(1, 1, max_batch_size=10**4.9,
                                        atomic_bsz_range=(1, 10**5))
    assert (atomic, accum) == (100, 0)
    assert goodput == pytest.approx(100 / 2.0 * 101 / 200, rel=1e-6)


def test_optimize_vectorised_and_bounds():
    f = GoodputFunction(P, GradParams(sqr=0.5, var=20.0), init_batch_size=64)
    nodes = np.array([1, 1, 2, 4])
    reps = np.array([1, 4, 8, 16])
    goodput, atomic, accum = f.optimize(nodes, reps, max_batch_size=1024,
                                        atomic_bsz_range=(16, 64))
    assert goodput.shape == atomic.shape == accum.shape == (4,)
    assert np.all(goodput > 0)
    assert np.all((atomic >= 16) & (atomic <= 64))
    # Each choice is the best of a brute force over all feasible (atomic, accum).
    for k in range(4):
        best = 0.0
        for s in range(0, 64):
            for a in range(16, 65):
                b = reps[k] * a * (s + 1)
                if 64 <= b <= 1024:
                    best = max(best, f.evaluate(nodes[k], reps[k], a, s))
        assert goodput[k] <= best * (1 + 1e-12)
        assert goodput[k] >= 0.97 * best  # 50 geometric samples: close to the optimum
    # Smallest batch 16 x 128 replicas = 2048 > max batch size: infeasible.
    g, a, s = f.optimize(16, 128, max_batch_size=1024, atomic_bsz_range=(16, 64))
    assert (g, a, s) == (0.0, 0, 0)


def test_optimize_accumulation_switch():
    f = GoodputFunction(P, GradParams(sqr=0.0, var=1.0), init_batch_size=128)
    # Pure noise: efficiency is 1 at every batch, so the largest batch wins; 1024 on one
    # replica needs micro-batches of <= 64.
    g, a, s = f.optimize(1, 1, max_batch_size=1024, atomic_bsz_range=(16, 64))
    assert (a, s) == (64, 15)
    assert g == pytest.approx(1024 / (16 * 0.74 + 1e-8), rel=1e-6)
    # Without accumulation even the smallest batch (128) does not fit in 64.
    g, a, s = f.optimize(1, 1, max_batch_size=1024, atomic_bsz_range=(16, 64),
                         accumulation=False)
    assert (g, a, s) == (0.0, 0, 0)


def test_fixed_batch():
    f = GoodputFunction(P, GradParams(sqr=1.0, var=1.0), init_batch_size=32)
    est = f.fixed_batch(np.array([1, 1, 2, 1]), np.array([1, 4, 8, 16]), 256,
                        atomic_bsz_range=(16, 32))
    # 1 replica: 256 = 8 x 32; 4 replicas: local 64 = 2 x 32; 8: local 32; 16: 16 each.
    np.testing.assert_array_equal(est.atomic_bsz, [32, 32, 32, 16])
    np.testing.assert_array_equal(est.accum_steps, [7, 1, 0, 0])
    np.testing.assert_array_equal(est.batch_size, [256] * 4)
    want = 256 / step_time(P, np.array([1, 1, 2, 1]), np.array([1, 4, 8, 16]),
                           est.atomic_bsz, est.accum_steps)
    np.testing.assert_allclose(est.throughput, want)
    np.testing.assert_array_equal(est.goodput, est.throughput)  # efficiency ignored
    # batch_size < num_replicas * lo: infeasible.
    est = f.fixed_batch(np.array([4]), np.array([32]), 256, atomic_bsz_range=(16, 32))
    assert est.goodput[0] == 0 and est.batch_size[0] == 0
