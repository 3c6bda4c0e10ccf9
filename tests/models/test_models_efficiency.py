"""Statistical efficiency from the gradient noise scale."""

import numpy as np
import pytest

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
