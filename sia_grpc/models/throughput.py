"""Pollux's (OSDI '21) throughput model for data-parallel training with all-reduce.

Time of one micro-batch's forward/backward pass ("compute", or "accum" time):

    T_c = alpha_c + beta_c * atomic_bsz

All-reduce time, bottlenecked by the slowest link the replicas span; the beta
terms model the retrogression of ring all-reduce as replicas are added beyond 2:

    T_net = alpha_n + beta_n * max(R - 2, 0)   if num_nodes > 1
          = alpha_r + beta_r * max(R - 2, 0)   elif num_replicas > 1
          = 1e-8                                otherwise

Compute and communication overlap partially; gamma >= 1 interpolates between
no overlap (gamma = 1, a sum) and full overlap (gamma -> inf, a max):

    T_sync = (T_c^gamma + T_net^gamma)^(1/gamma)

With `accum_steps` s extra micro-batches before the syncing one, an iteration
takes s * T_c + T_sync and processes num_replicas * atomic_bsz * (s + 1) samples.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import scipy.optimize
from threadpoolctl import ThreadpoolController

__all__ = [
    "PerfParams",
    "compute_time",
    "network_time",
    "sync_time",
    "step_time",
    "throughput",
    "fit_perf_params",
]

_TINY = 1e-8  # network time of a lone replica, and the lower bound of every fitted term
_LOWER = np.array([_TINY] * 6 + [1.0])
_UPPER = np.array([np.inf] * 6 + [10.0])
_START = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3])
_AC, _BC, _AN, _BN, _AR, _BR, _G = range(7)


@dataclass(frozen=True)
class PerfParams:
    alpha_c: float  # constant part of compute time (s)
    beta_c: float  # compute time per sample (s)
    alpha_n: float  # inter-node all-reduce constant (s)
    beta_n: float  # inter-node retrogression per replica beyond 2 (s)
    alpha_r: float  # intra-node all-reduce constant (s)
    beta_r: float  # intra-node retrogression per replica beyond 2 (s)
    gamma: float  # compute/communication overlap exponent, in [1, 10]

    def as_array(self) -> npt.NDArray[np.float64]:
        # Not dataclasses.astuple: it deep-copies each field, and this runs for every
        # type of every job whose model changed (a third of a 1,000-job round's time).
        return np.array([self.alpha_c, self.beta_c, self.alpha_n, self.beta_n,
                         self.alpha_r, self.beta_r, self.gamma], dtype=float)


def compute_time(params: PerfParams, atomic_bsz: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Time of one micro-batch's forward and backward pass."""
    return params.alpha_c + params.beta_c * np.asarray(atomic_bsz, dtype=float)


def network_time(params: PerfParams, num_nodes: npt.ArrayLike,
                 num_replicas: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """All-reduce time of one optimizer step."""
    nodes = np.asarray(num_nodes)
    reps = np.asarray(num_replicas)
    extra = np.maximum(reps - 2, 0).astype(float)
    inter = params.alpha_n + params.beta_n * extra
    intra = params.alpha_r + params.beta_r * extra
    return np.where(nodes > 1, inter, np.where(reps > 1, intra, _TINY))


def sync_time(params: PerfParams, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
              atomic_bsz: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Time of the micro-batch that ends with the gradient all-reduce (T_sync)."""
    t_c = compute_time(params, atomic_bsz)
    t_n = network_time(params, num_nodes, num_replicas)
    g = params.gamma
    return (t_c**g + t_n**g) ** (1.0 / g)


def step_time(params: PerfParams, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
              atomic_bsz: npt.ArrayLike,
              accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
    """Time of one optimizer step (iteration), accumulation included."""
    t_c = compute_time(params, atomic_bsz)
    t_n = network_time(params, num_nodes, num_replicas)
    g = params.gamma
    return np.asarray(accum_steps) * t_c + (t_c**g + t_n**g) ** (1.0 / g)


def throughput(params: PerfParams, num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
               atomic_bsz: npt.ArrayLike,
               accum_steps: npt.ArrayLike = 0) -> npt.NDArray[np.float64]:
    """Samples per second."""
    accum = np.asarray(accum_steps)
    samples = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (accum + 1)
    out: npt.NDArray[np.float64] = samples / step_time(params, num_nodes, num_replicas,
                                                        atomic_bsz, accum)
    return out


# ---------------------------------------------------------------------------------------------
# Fitting


class _Observations(NamedTuple):
    """The data of a fit, in the form the loss reads it: one entry per observation."""

    bsz: npt.NDArray[np.float64]
    extra: npt.NDArray[np.float64]  # replicas beyond 2
    is_inter: npt.NDArray[np.bool_]  # spans nodes
    is_intra: npt.NDArray[np.bool_]  # several replicas within one node
    y_accum: npt.NDArray[np.float64]  # log of the non-syncing micro-batch's time
    y_optim: npt.NDArray[np.float64]  # log of the syncing micro-batch's time


def _objective(theta: npt.NDArray[np.float64],
               data: _Observations) -> tuple[float, npt.NDArray[np.float64]]:
    """Pollux's fitting loss and its analytic gradient w.r.t. all 7 parameters."""
    bsz, extra, is_inter, is_intra, y_accum, y_optim = data
    ac, bc, an, bn, ar, br, g = theta
    n = bsz.size

    a = ac + bc * bsz
    net = np.where(is_inter, an + bn * extra, np.where(is_intra, ar + br * extra, _TINY))
    la = np.log(a)
    ln = np.log(net)
    # log T_sync, computed stably as a log-sum-exp of the gamma-powered times.
    lo = np.logaddexp(g * la, g * ln) / g

    e1 = la - y_accum
    e2 = lo - y_optim
    err1 = np.sqrt(np.mean(e1 * e1))
    err2 = np.sqrt(np.mean(e2 * e2))
    reg1 = 1e-3 * (g - 1.0) ** 2
    reg2 = 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    loss = err1 + err2 + reg1 + reg2

    # d err / d prediction; an exact fit has zero error and (sub)gradient zero.
    d1 = e1 / (n * err1) if err1 > 0 else np.zeros(n)
    d2 = e2 / (n * err2) if err2 > 0 else np.zeros(n)
    w_a = np.exp(g * la - g * lo)  # share of T_c^g in T_c^g + T_net^g
    w_n = np.exp(g * ln - g * lo)
    g_a = (d1 + d2 * w_a) / a  # d loss / d T_c per observation
    g_n = d2 * w_n / net  # d loss / d T_net per observation
    g_n_inter = np.where(is_inter, g_n, 0.0)
    g_n_intra = np.where(is_intra, g_n, 0.0)

    grad = np.empty(7)
    grad[_AC] = g_a.sum()
    grad[_BC] = (g_a * bsz).sum()
    grad[_AN] = g_n_inter.sum() - 2e-2 * bn**2 / an**3
    grad[_BN] = (g_n_inter * extra).sum() + 2e-2 * bn / an**2
    grad[_AR] = g_n_intra.sum() - 2e-2 * br**2 / ar**3
    grad[_BR] = (g_n_intra * extra).sum() + 2e-2 * br / ar**2
    grad[_G] = (d2 * (w_a * la + w_n * ln - lo) / g).sum() + 2e-3 * (g - 1.0)
    return float(loss), grad


@functools.cache
def _blas_controller() -> ThreadpoolController:
    # Scanning the process's loaded libraries costs ~1.5 ms; do it once.
    return ThreadpoolController()


def fit_perf_params(num_nodes: npt.ArrayLike, num_replicas: npt.ArrayLike,
                    atomic_bsz: npt.ArrayLike, accum_step_time: npt.ArrayLike,
                    optim_step_time: npt.ArrayLike) -> PerfParams:
    """Fit PerfParams to observed step times, as Pollux does.

    A pure function of the data, memoised on it: jobs of one application share
    their profiling data (and, in simulation, often their observations), so the
    same ~10 ms fit would otherwise be repeated for each of them.

    `accum_step_time` is the time of a non-syncing micro-batch (for measurements
    at accumulation 0: step_time - sync_time) and `optim_step_time` the time of
    the syncing one (step_time). Parameters the data cannot identify are frozen
    the way Pollux freezes them, which keeps the model optimistic about scaling.
    """
    nodes = np.atleast_1d(np.asarray(num_nodes, dtype=np.int64))
    reps = np.atleast_1d(np.asarray(num_replicas, dtype=np.int64))
    bsz = np.atleast_1d(np.asarray(atomic_bsz, dtype=float))
    t_accum = np.atleast_1d(np.asarray(accum_step_time, dtype=float))
    t_optim = np.atleast_1d(np.asarray(optim_step_time, dtype=float))
    nodes, reps, bsz, t_accum, t_optim = np.broadcast_arrays(nodes, reps, bsz, t_accum, t_optim)
    if nodes.size == 0:
        raise ValueError("fit_perf_params: no observations")
    if not (np.all(t_accum > 0) and np.all(t_optim > 0)):
        raise ValueError("fit_perf_params: step times must be positive")
    if np.any(reps < 1) or np.any(nodes < 1) or np.any(nodes > reps):
        raise ValueError("fit_perf_params: need 1 <= num_nodes <= num_replicas")
    key = tuple(a.tobytes() for a in (nodes, reps, bsz, t_accum, t_optim))
    params = _FITS.get(key)
    if params is None:
        if len(_FITS) >= _FITS_LIMIT:
            _FITS.clear()
        params = _FITS[key] = _fit(nodes, reps, bsz, t_accum, t_optim)
    return params


_FITS: dict[tuple[bytes, ...], PerfParams] = {}  # memo of fit_perf_params by its data
_FITS_LIMIT = 4096


def _start(nodes: npt.NDArray[np.int64], reps: npt.NDArray[np.int64],
           bsz: npt.NDArray[np.float64], t_accum: npt.NDArray[np.float64],
           ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The fit's start and which of its parameters stay there: those the data cannot
    identify, frozen the way Pollux freezes them."""
    theta = _START.copy()
    fixed = np.zeros(7, dtype=bool)
    if np.unique(bsz).size == 1:
        # One batch size cannot separate alpha_c from beta_c: split the time evenly,
        # which is optimistic about larger batches.
        theta[_AC] = np.mean(t_accum) / 2.0
        fixed[_AC] = True
    if not np.any(nodes > 1):
        theta[[_AN, _BN]] = _TINY
        fixed[[_AN, _BN]] = True
    if not np.any((nodes == 1) & (reps > 1)):
        theta[[_AR, _BR]] = _TINY
        fixed[[_AR, _BR]] = True
    if not np.any(reps > 2):
        theta[[_BN, _BR]] = _TINY
        fixed[[_BN, _BR]] = True
    return theta, fixed


def _fit(nodes: npt.NDArray[np.int64], reps: npt.NDArray[np.int64],
         bsz: npt.NDArray[np.float64], t_accum: npt.NDArray[np.float64],
         t_optim: npt.NDArray[np.float64]) -> PerfParams:
    theta, fixed = _start(nodes, reps, bsz, t_accum)
    data = _Observations(
        bsz,
        np.maximum(reps - 2, 0).astype(float),
        nodes > 1,
        (nodes == 1) & (reps > 1),
        np.log(t_accum),
        np.log(t_optim),
    )
    free = np.flatnonzero(~fixed)
    # The six times are searched in log space (same bounds): they span orders of
    # magnitude, and in linear space L-BFGS-B stops early on this loss, e.g. missing
    # the exact parameters of noise-free data by 10-50% in step time.
    is_log = free < _G

    def fun(x: npt.NDArray[np.float64]) -> tuple[float, npt.NDArray[np.float64]]:
        with np.errstate(all="ignore"):
            values = np.where(is_log, np.exp(np.where(is_log, x, 0.0)), x)
            full = theta.copy()
            full[free] = values
            loss, grad = _objective(full, data)
            grad = np.where(is_log, grad[free] * values, grad[free])
        if not (np.isfinite(loss) and np.all(np.isfinite(grad))):
            # A trial step far outside any sane time (exp overflow): a huge loss
            # makes the line search back off instead of carrying NaNs on.
            return 1e100, np.zeros_like(x)
        return loss, grad

    x0 = np.where(is_log, np.log(theta[free]), theta[free])
    lower = np.where(is_log, np.log(_LOWER[free]), _LOWER[free])
    # A 7-parameter fit gains nothing from BLAS threads, and SciPy's bounded
    # L-BFGS-B is 15-40x slower with multi-threaded OpenBLAS on a busy machine
    # (scipy#22438): pin BLAS to one thread for the fit only.
    with _blas_controller().limit(limits=1, user_api="blas"):
        result = scipy.optimize.minimize(
            fun, x0, jac=True, method="L-BFGS-B",
            bounds=list(zip(lower, _UPPER[free], strict=True)),
            options={"ftol": 1e-10, "maxiter": 2000},
        )
    x = result.x if np.all(np.isfinite(result.x)) else x0
    values = np.where(is_log, np.exp(np.where(is_log, x, 0.0)), x)
    theta[free] = np.clip(values, _LOWER[free], _UPPER[free])
    if not np.any(nodes > 1):
        # Prior: crossing nodes is no faster than staying within one.
        theta[_AN] = max(theta[_AN], 1.1 * theta[_AR])
        theta[_BN] = max(theta[_BN], 1.1 * theta[_BR])
    return PerfParams(*(float(v) for v in theta))
