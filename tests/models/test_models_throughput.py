"""Pollux's throughput model: hand-checked values and fitting."""

import numpy as np
import pytest
import scipy.optimize

from sia_grpc.models.throughput import (
    PerfParams,
    _objective,
    compute_time,
    fit_perf_params,
    network_time,
    step_time,
    sync_time,
    throughput,
)

# gamma = 1: no overlap, so step times are plain sums.
P = PerfParams(alpha_c=0.1, beta_c=0.01, alpha_n=0.2, beta_n=0.05, alpha_r=0.1, beta_r=0.02,
               gamma=1.0)


def test_hand_computed_times():
    assert compute_time(P, 10) == pytest.approx(0.2)
    assert network_time(P, 1, 1) == pytest.approx(0.0, abs=1e-7)
    assert network_time(P, 1, 2) == pytest.approx(0.1)  # alpha_r, no retrogression at 2
    assert network_time(P, 1, 4) == pytest.approx(0.1 + 0.02 * 2)
    assert network_time(P, 2, 8) == pytest.approx(0.2 + 0.05 * 6)
    assert network_time(P, 2, 2) == pytest.approx(0.2)  # inter-node beats replica count


def test_hand_computed_throughput():
    assert throughput(P, 1, 1, 10) == pytest.approx(10 / 0.2)
    assert throughput(P, 1, 4, 10) == pytest.approx(40 / 0.34)
    assert throughput(P, 2, 8, 10) == pytest.approx(80 / 0.7)
    # Accumulation: 3 extra micro-batches of 0.2 s, then the syncing one of 0.34 s.
    assert step_time(P, 1, 4, 10, 3) == pytest.approx(3 * 0.2 + 0.34)
    assert throughput(P, 1, 4, 10, 3) == pytest.approx(4 * 10 * 4 / 0.94)


def test_gamma_overlap():
    p2 = PerfParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, gamma=2.0)
    assert sync_time(p2, 1, 2, 10) == pytest.approx(np.hypot(0.2, 0.1))
    p10 = PerfParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, gamma=10.0)
    # Near-complete overlap: close to max(T_c, T_net).
    assert sync_time(p10, 2, 8, 10) == pytest.approx(0.5, rel=1e-3)


def test_broadcasting():
    nodes = np.array([1, 1, 2])
    reps = np.array([1, 4, 8])
    bsz = np.array([[10], [20]])
    out = throughput(P, nodes, reps, bsz, 0)
    assert out.shape == (2, 3)
    assert out[0, 1] == pytest.approx(40 / 0.34)


def test_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    nodes = np.array([1, 1, 1, 2, 2, 3, 1])
    reps = np.array([1, 2, 4, 4, 8, 12, 3])
    bsz = np.array([8, 16, 32, 16, 64, 32, 8.0])
    data = (bsz, np.maximum(reps - 2, 0).astype(float), nodes > 1, (nodes == 1) & (reps > 1),
            np.log(0.01 + 0.001 * bsz) + rng.normal(0, 0.05, 7),
            np.log(0.02 + 0.001 * bsz) + rng.normal(0, 0.05, 7))
    for _ in range(5):
        theta = np.concatenate([rng.uniform(0.01, 0.2, 6), [rng.uniform(1, 3)]])
        err = scipy.optimize.check_grad(lambda x: _objective(x, data)[0],
                                        lambda x: _objective(x, data)[1], theta)
        assert err < 1e-4 * np.linalg.norm(_objective(theta, data)[1])


def _synthetic(params, configs, sizes):
    nodes, reps, bsz = (np.array(v) for v in zip(
        *[(n, r, b) for n, r in configs for b in sizes], strict=True))
    return nodes, reps, bsz, compute_time(params, bsz), sync_time(params, nodes, reps, bsz)


@pytest.mark.parametrize("truth", [
    PerfParams(0.05, 0.004, 0.3, 0.02, 0.05, 0.005, 1.5),
    PerfParams(0.2, 0.001, 0.1, 0.01, 0.02, 0.002, 1.0),
    PerfParams(0.01, 0.0005, 0.05, 0.004, 0.01, 0.001, 3.0),
])
def test_fit_recovers_predictions(truth):
    configs = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 2), (2, 8), (2, 16), (3, 12), (4, 32)]
    nodes, reps, bsz, accum, optim = _synthetic(truth, configs, [8, 16, 32, 64, 128, 256])
    fit = fit_perf_params(nodes, reps, bsz, accum, optim)
    # Predictions on the fitted grid and off it (other sizes, more replicas).
    for n, r, b in [(nodes, reps, bsz), (np.array([1, 2, 5, 8]), np.array([6, 12, 20, 64]),
                                          np.array([24, 48, 100, 200]))]:
        got = step_time(fit, n, r, b, 1)
        want = step_time(truth, n, r, b, 1)
        np.testing.assert_allclose(got, want, rtol=0.01)


def test_fit_freezes_unidentifiable_terms():
    truth = PerfParams(0.05, 0.004, 0.3, 0.02, 0.05, 0.005, 1.5)
    # 1-GPU only: all network terms stay at the bound; the prior alpha_n >= 1.1 alpha_r holds.
    n, r, b, accum, optim = _synthetic(truth, [(1, 1)], [8, 16, 32, 64])
    fit = fit_perf_params(n, r, b, accum, optim)
    assert fit.alpha_r == fit.beta_r == 1e-8
    assert fit.alpha_n == pytest.approx(1.1e-8) and fit.beta_n == pytest.approx(1.1e-8)
    np.testing.assert_allclose(compute_time(fit, b), accum, rtol=1e-3)
    # One batch size: alpha_c is pinned at half the mean compute time.
    n, r, b, accum, optim = _synthetic(truth, [(1, 1), (1, 2)], [32])
    fit = fit_perf_params(n, r, b, accum, optim)
    assert fit.alpha_c == pytest.approx(np.mean(accum) / 2)
    # No more than 2 replicas: no retrogression terms; single node: alpha_n from the prior.
    assert fit.beta_r == 1e-8
    assert fit.alpha_n == pytest.approx(1.1 * fit.alpha_r)
    # Multi-node data without single-node multi-replica data: alpha_r, beta_r frozen.
    n, r, b, accum, optim = _synthetic(truth, [(1, 1), (2, 2), (2, 4), (4, 8)], [8, 32])
    fit = fit_perf_params(n, r, b, accum, optim)
    assert fit.alpha_r == fit.beta_r == 1e-8
    assert fit.alpha_n > 1e-3


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_perf_params([1], [1], [8], [0.0], [0.1])
    with pytest.raises(ValueError):
        fit_perf_params([2], [1], [8], [0.1], [0.2])
    with pytest.raises(ValueError):
        fit_perf_params([], [], [], [], [])
