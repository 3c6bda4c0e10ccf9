"""The CDF figures: job completion time and finish-time fairness, one curve per
policy on one log x-axis, every workload of a policy pooled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sia_grpc.sim.metrics import finished_jcts_h, rhos
from sia_grpc.sim.plots.canvas import new_figure, no_data, pooled, runs_label, save
from sia_grpc.sim.records import SimResult

_MIN_JCT_H = 1.0 / 3600.0  # JCTs below one second are drawn at one second (log axis)


def _ecdf(ax: Any, values: Sequence[float], label: str) -> bool:
    """Draw an empirical CDF; False (nothing drawn) for no values."""
    xs = np.sort(np.asarray(values, dtype=float))
    if xs.size == 0:
        return False
    ys = np.arange(1, xs.size + 1) / xs.size
    ax.step(np.concatenate([xs[:1], xs]), np.concatenate([[0.0], ys]), where="post",
            label=f"{label} ({xs.size} jobs)")
    return True


def _log_x(ax: Any, values: Sequence[float], include: Sequence[float] = ()) -> None:
    """Log x-axis over the positive values (and `include`), padded so that it spans
    at least a few ticks, with plain-number labels."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):  # LogFormatter's choice of ticks to label, as 0.1, 2, 100
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    pos = [float(v) for v in (*values, *include) if v > 0]
    ax.set_xscale("log")
    if pos:
        ax.set_xlim(min(pos) / 1.5, max(pos) * 1.5)
    ax.xaxis.set_major_formatter(Plain(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _cdf_figure(series: Mapping[str, list[float]], *, xlabel: str, title: str, empty: str,
                include: tuple[float, ...] = (), line_at: float | None = None,
                line_label: str = "") -> Any:
    """One CDF per policy on one log x-axis (so every policy shares both axes),
    and an optional dashed reference line."""
    fig = new_figure()
    ax = fig.add_subplot()
    drawn: list[float] = []
    for policy, values in series.items():
        if _ecdf(ax, values, str(policy)):
            drawn.extend(values)
    if line_at is not None:
        ax.axvline(line_at, color="black", linestyle="--", linewidth=1.0, label=line_label)
    if drawn or include:
        _log_x(ax, drawn, include=include)
    if drawn:
        ax.legend(loc="lower right", fontsize="small")
    else:
        no_data(ax, empty)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(title, fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def jct_cdf_figure(results_by_policy: Mapping[str, Sequence[SimResult]]) -> Any:
    """CDF of job completion time (hours, log x-axis) per policy, all workloads pooled.
    Unfinished jobs are left out (the legend counts the jobs drawn)."""
    series = {p: [max(j, _MIN_JCT_H) for r in results for j in finished_jcts_h(r)]
              for p, results in results_by_policy.items()}
    return _cdf_figure(series, xlabel="job completion time (hours, log scale)",
                       title=f"JCT CDF\n{runs_label(pooled(results_by_policy))}",
                       empty="no finished jobs")


def ftf_cdf_figure(results_by_policy: Mapping[str, Sequence[SimResult]]) -> Any:
    """CDF of finish-time fairness ρ = JCT / isolated JCT per policy (log x-axis),
    with a vertical line at ρ = 1: jobs right of it finished later than they would
    have on their fair share of the cluster."""
    series = {p: [v for r in results for v in rhos(r) if v > 0]
              for p, results in results_by_policy.items()}
    return _cdf_figure(
        series, xlabel="finish-time fairness ρ = JCT / isolated JCT (ratio, log scale)",
        title=f"Finish-time fairness CDF\n{runs_label(pooled(results_by_policy))}",
        empty="no jobs with a finish-time fairness", include=(0.5, 2.0), line_at=1.0,
        line_label="ρ = 1 (fair share)")


def jct_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """`jct_cdf_figure`, saved as PNG at `path`."""
    return save(jct_cdf_figure(results_by_policy), path)


def ftf_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """`ftf_cdf_figure`, saved as PNG at `path`."""
    return save(ftf_cdf_figure(results_by_policy), path)
