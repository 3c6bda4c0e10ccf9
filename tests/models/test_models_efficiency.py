"""Statistical efficiency from the gradient noise scale."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_grpc.models.efficiency import GradParams, efficiency, gain, grad_params_at_progress
from sia_grpc.models.profiles import ValidationTable


def test_efficiency_is_one_at_initial_batch():
    g = GradParams(sqr=0.3, var=7.0)
    assert efficiency(g, 128, 128) == pytest.approx(1.0)
    assert gain(g, 128, 128) == pytest.approx(1.0)


def test_gain_at_hand_computed_point():
    g = GradParams(sqr=1.0, var=3.0)
    # S = 4: gain = (3 + 1) / (3/4 + 1) = 16/7, efficiency = gain / 4 = 4/7.
    assert gain(g, 512, 128) == pytest.approx(16 / 7)
    assert efficiency(g, 512, 128) == pytest.approx(4 / 7)


def test_limits_and_vectorisation():
    batch = np.array([128, 256, 1024, 8192])
    noisy = efficiency(GradParams(sqr=0.0, var=5.0), batch, 128)  # pure noise: linear scaling
    np.testing.assert_allclose(noisy, 1.0)
    clean = efficiency(GradParams(sqr=5.0, var=0.0), batch, 128)  # no noise: no gain at all
    np.testing.assert_allclose(clean, 128 / batch)
    zero = efficiency(GradParams(sqr=0.0, var=0.0), batch, 128)  # denominator 0: gain 1
    np.testing.assert_allclose(zero, 128 / batch)
    mixed = efficiency(GradParams(sqr=1.0, var=10.0), batch, 128)
    assert np.all(np.diff(mixed) < 0) and np.all(mixed <= 1.0)


def _table(progress):
    n = len(progress)
    arr = np.asarray(progress, dtype=float)
    return ValidationTable(16, arr, arr, np.zeros(n), np.arange(n) + 1.0, np.arange(n) + 10.0)


def test_grad_params_at_progress():
    t = _table([10, 20, 30])
    assert grad_params_at_progress(t, 0.0) == GradParams(1.0, 10.0)
    assert grad_params_at_progress(t, 0.5) == GradParams(2.0, 11.0)  # progress 15: epoch 1
    assert grad_params_at_progress(t, 1 / 3) == GradParams(2.0, 11.0)  # end of epoch 0
    assert grad_params_at_progress(t, 1.0) == GradParams(3.0, 12.0)
    with pytest.raises(ValueError):
        grad_params_at_progress(t, 1.5)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.booleans(), st.integers(0, 2**32 - 1))
def test_efficiency_is_the_formula_bit_for_bit(rows, cols, signed, seed):
    """Computed in place, over jobs × candidate batches with per-job statistics, it
    equals the formula (var + sqr) / (var + sqr·S), 1/S where that denominator is not
    positive, to the last bit, scalars and broadcasting included."""
    rng = np.random.default_rng(seed)
    batch = rng.integers(1, 4096, (rows, cols)).astype(float)
    init = rng.integers(1, 512, (rows, 1)).astype(float)
    sqr, var = rng.normal(1.0, 2.0, (rows, 1)), rng.normal(10.0, 30.0, (rows, 1))
    if not signed:
        sqr, var = np.abs(sqr), np.abs(var)

    def formula(s, v, b, b0):
        scale = np.asarray(b, dtype=float) / np.asarray(b0, dtype=float)
        denom = v + s * scale
        return np.where(denom > 0, (v + s) / np.where(denom > 0, denom, 1.0), 1.0 / scale)

    for s, v, b, b0 in ((sqr, var, batch, init), (float(sqr[0, 0]), var, 64.0, 32.0),
                        (float(sqr[0, 0]), float(var[0, 0]), batch[0], 128.0),
                        (float(sqr[0, 0]), float(var[0, 0]), 96.0, 128.0)):
        got = efficiency(GradParams(sqr=s, var=v), b, b0)
        want = formula(s, v, b, b0)
        assert np.shape(got) == np.shape(want)
        assert np.array_equal(got, want)
