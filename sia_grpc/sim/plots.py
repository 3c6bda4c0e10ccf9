"""Figures of simulation runs: JCT and finish-time-fairness CDFs per policy, and
GPUs allocated over time by type (like the paper's Figure 5).

matplotlib is optional (`pip install 'sia-grpc[plots]'`) and imported only inside
these functions, so importing `sia_grpc.sim` never needs it. Figures are drawn on
the Agg canvas directly, without pyplot, so no global backend or figure state is
touched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sia_grpc.sim.metrics import finished_jcts_h, rhos
from sia_grpc.sim.records import SimResult

__all__ = ["allocation_over_time", "ftf_cdf", "jct_cdf", "safe_name", "write_all"]

_MIN_JCT_H = 1.0 / 3600.0  # JCTs below one second are drawn at one second (log axis)


def _figure(figsize: tuple[float, float] = (6.4, 4.0)) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - exercised by a test that hides it
        raise ImportError(
            "sia_grpc.sim.plots needs matplotlib; install it with "
            "pip install 'sia-grpc[plots]'"
        ) from e
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


def _ecdf(ax: Any, values: Sequence[float], label: str) -> bool:
    """Draw an empirical CDF; False (nothing drawn) for no values."""
    xs = np.sort(np.asarray(values, dtype=float))
    if xs.size == 0:
        return False
    ys = np.arange(1, xs.size + 1) / xs.size
    ax.step(np.concatenate([xs[:1], xs]), np.concatenate([[0.0], ys]), where="post",
            label=f"{label} (n={xs.size})")
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


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="gray")


def _cdf_plot(series: Mapping[str, list[float]], path: str | Path, *, xlabel: str, title: str,
              empty: str, include: tuple[float, ...] = (), line_at: float | None = None,
              ) -> Path:
    """One CDF per policy on a log x-axis (and an optional dashed reference line)."""
    fig = _figure()
    ax = fig.add_subplot()
    drawn: list[float] = []
    for policy, values in series.items():
        if _ecdf(ax, values, str(policy)):
            drawn.extend(values)
    if line_at is not None:
        ax.axvline(line_at, color="black", linestyle="--", linewidth=1.0,
                   label=f"ρ = {line_at:g}")
    if drawn or include:
        _log_x(ax, drawn, include=include)
    if drawn:
        ax.legend(loc="lower right")
    else:
        _no_data(ax, empty)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def jct_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """CDF of job completion time (hours, log x-axis) per policy, all workloads pooled.
    Unfinished jobs are left out (the legend counts the jobs drawn)."""
    series = {p: [max(j, _MIN_JCT_H) for r in results for j in finished_jcts_h(r)]
              for p, results in results_by_policy.items()}
    return _cdf_plot(series, path, xlabel="job completion time (hours)", title="JCT CDF",
                     empty="no finished jobs")


def ftf_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """CDF of finish-time fairness ρ = JCT / isolated JCT per policy (log x-axis),
    with a vertical line at ρ = 1: jobs right of it finished later than they would
    have on their fair share of the cluster."""
    series = {p: [v for r in results for v in rhos(r) if v > 0]
              for p, results in results_by_policy.items()}
    return _cdf_plot(series, path, xlabel="finish-time fairness ρ (JCT / isolated JCT)",
                     title="Finish-time fairness CDF", empty="no jobs with a finish-time fairness",
                     include=(0.5, 2.0), line_at=1.0)


def allocation_over_time(result: SimResult, path: str | Path) -> Path:
    """GPUs allocated per round, stacked by GPU type, against time (hours). Each
    type's dashed line is the capacity of the stack up to and including it, the
    most that the top of its band can reach (the top line is the cluster's size)."""
    fig = _figure((7.2, 4.0))
    ax = fig.add_subplot()
    types = list(result.capacity)
    for r in result.rounds:
        types.extend(t for t in r.gpus_in_use if t not in types)
    colors = [f"C{i % 10}" for i in range(len(types))]
    if result.rounds and types:
        x = np.asarray([r.time for r in result.rounds], dtype=float) / 3600.0
        ys = np.asarray([[r.gpus_in_use.get(t, 0) for r in result.rounds] for t in types],
                        dtype=float)
        ax.stackplot(x, ys, labels=types, colors=colors, step="post", alpha=0.8)
        ax.set_xlim(float(x[0]), float(x[-1]) if x[-1] > x[0] else float(x[0]) + 1.0)
    else:
        _no_data(ax, "no rounds")
    cum = 0
    for t, c in zip(types, colors, strict=True):
        cap = int(result.capacity.get(t, 0))
        if cap <= 0:
            continue
        cum += cap
        ax.axhline(cum, color=c, linestyle="--", linewidth=1.0,
                   label=f"{t} capacity ({cap})")
    total = sum(int(v) for v in result.capacity.values())
    ax.set_ylim(0, max(1, total) * 1.08)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs allocated")
    ax.set_title(f"{result.policy} on {result.workload} ({result.cluster})")
    if types:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def safe_name(name: str) -> str:
    """`name` made safe as part of a file name."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._")
    return s or "unnamed"


def write_all(results_by_policy: Mapping[str, Sequence[SimResult]],
              out_dir: str | Path) -> list[Path]:
    """Write jct_cdf.png, ftf_cdf.png and allocation_<policy>_<workload>.png (for
    the first workload of each policy) into out_dir; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [jct_cdf(results_by_policy, out / "jct_cdf.png"),
             ftf_cdf(results_by_policy, out / "ftf_cdf.png")]
    used: set[str] = set()
    for policy, results in results_by_policy.items():
        if not results:
            continue
        first = results[0]
        stem = f"allocation_{safe_name(policy)}_{safe_name(first.workload)}"
        name, k = stem, 1
        while name in used:  # two names that sanitise alike
            k += 1
            name = f"{stem}_{k}"
        used.add(name)
        paths.append(allocation_over_time(first, out / f"{name}.png"))
    return paths
