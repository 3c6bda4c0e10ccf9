"""Figures of simulation runs: JCT and finish-time-fairness CDFs per policy,
GPUs allocated over time, one panel per GPU type (like the paper's Figure 5), and,
for runs with queues, GPUs held per queue and type over time against its guarantee.

Every figure follows the same conventions, so that figures can be published and
read side by side:

* its title names the workload(s), the cluster and, for a figure of one run, the
  policy;
* every axis says its unit (hours, GPUs, fraction of jobs);
* what is compared across policies shares its axes: the CDFs draw every policy on
  one axes, and the allocation figures of one workload share one `AllocationFrame`
  (time range, bin width, y range of each GPU type's panel, layer colours).

Each figure has a `*_figure` function that builds it without saving (tests and
notebooks inspect the matplotlib objects) and a function that saves it as PNG.

matplotlib is optional (`pip install 'sia-grpc[plots]'`) and imported only inside
these functions, so importing `sia_grpc.sim` never needs it. Figures are drawn on
the Agg canvas directly, without pyplot, so no global backend or figure state is
touched.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sia_grpc.sim.metrics import finished_jcts_h, rhos
from sia_grpc.sim.queue_metrics import UNITS
from sia_grpc.sim.records import SimResult, round_length

__all__ = [
    "AllocationFrame",
    "StepPanel",
    "allocation_figure",
    "allocation_figures",
    "allocation_frame",
    "allocation_over_time",
    "allocation_panels",
    "binned_mean",
    "ftf_cdf",
    "ftf_cdf_figure",
    "jct_cdf",
    "jct_cdf_figure",
    "queue_figure",
    "queue_figures",
    "queue_panels",
    "safe_name",
    "step_panels",
    "write_all",
]

_HOUR = 3600.0
_MIN_JCT_H = 1.0 / 3600.0  # JCTs below one second are drawn at one second (log axis)
_MAX_BINS = 160  # time bins per allocation figure: legible steps at a column's width
_UNATTRIBUTED = "(not recorded per job)"  # GPUs in use that no per-job allocation explains
_HEADROOM = 1.12  # y range above a panel's capacity line, room for its heading
# Layer colours (ColorBrewer Set2): not the default cycle, which the CDFs use for
# policies, so that no colour reads as a policy in one figure and an application
# in the next. The unattributed remainder is grey.
_LAYER_COLORS = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494")
_GREY = "#b3b3b3"


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


def _workload_label(workload: str) -> str:
    """A shipped name as is ("saturn/workload-1"); a CSV path as its last folder
    and stem ("mytraces/day-3"), which is what tells two runs apart."""
    p = Path(workload)
    if p.suffix.lower() != ".csv":
        return workload
    return f"{p.parent.name}/{p.stem}" if p.parent.name else p.stem


def _runs_label(results: Sequence[SimResult]) -> str:
    """What a figure of pooled runs shows: "saturn/workload-1, cluster hetero64x1",
    or for several workloads their trace groups, "philly, saturn (9 workloads
    pooled), cluster hetero64x1"."""
    workloads = list(dict.fromkeys(_workload_label(r.workload) for r in results))
    clusters = ", ".join(dict.fromkeys(r.cluster for r in results)) or "none"
    if not workloads:
        return f"no runs, cluster {clusters}"
    if len(workloads) == 1:
        return f"{workloads[0]}, cluster {clusters}"
    groups = ", ".join(dict.fromkeys(w.split("/")[0] for w in workloads))
    return f"{groups} ({len(workloads)} workloads pooled), cluster {clusters}"


# ---------------------------------------------------------------- CDFs


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


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="gray")


def _cdf_figure(series: Mapping[str, list[float]], *, xlabel: str, title: str, empty: str,
                include: tuple[float, ...] = (), line_at: float | None = None,
                line_label: str = "") -> Any:
    """One CDF per policy on one log x-axis (so every policy shares both axes),
    and an optional dashed reference line."""
    fig = _figure()
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
        _no_data(ax, empty)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0.0, 1.02)
    ax.set_title(title, fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def _pooled(results_by_policy: Mapping[str, Sequence[SimResult]]) -> list[SimResult]:
    return [r for results in results_by_policy.values() for r in results]


def jct_cdf_figure(results_by_policy: Mapping[str, Sequence[SimResult]]) -> Any:
    """CDF of job completion time (hours, log x-axis) per policy, all workloads pooled.
    Unfinished jobs are left out (the legend counts the jobs drawn)."""
    series = {p: [max(j, _MIN_JCT_H) for r in results for j in finished_jcts_h(r)]
              for p, results in results_by_policy.items()}
    return _cdf_figure(series, xlabel="job completion time (hours, log scale)",
                       title=f"JCT CDF\n{_runs_label(_pooled(results_by_policy))}",
                       empty="no finished jobs")


def ftf_cdf_figure(results_by_policy: Mapping[str, Sequence[SimResult]]) -> Any:
    """CDF of finish-time fairness ρ = JCT / isolated JCT per policy (log x-axis),
    with a vertical line at ρ = 1: jobs right of it finished later than they would
    have on their fair share of the cluster."""
    series = {p: [v for r in results for v in rhos(r) if v > 0]
              for p, results in results_by_policy.items()}
    return _cdf_figure(
        series, xlabel="finish-time fairness ρ = JCT / isolated JCT (ratio, log scale)",
        title=f"Finish-time fairness CDF\n{_runs_label(_pooled(results_by_policy))}",
        empty="no jobs with a finish-time fairness", include=(0.5, 2.0), line_at=1.0,
        line_label="ρ = 1 (fair share)")


def jct_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """`jct_cdf_figure`, saved as PNG at `path`."""
    return _save(jct_cdf_figure(results_by_policy), path)


def ftf_cdf(results_by_policy: Mapping[str, Sequence[SimResult]], path: str | Path) -> Path:
    """`ftf_cdf_figure`, saved as PNG at `path`."""
    return _save(ftf_cdf_figure(results_by_policy), path)


# ------------------------------------------- step series against a limit, per panel


@dataclass(frozen=True)
class StepPanel:
    """One panel of a `step_panels` figure: values per time bin, stacked in layer
    order, against a limit line (a GPU type's capacity, a queue's guarantee).

    `layers` maps a layer's label to one value per bin; `limit` is one number for
    the whole time axis or one per bin (a limit that changes over time)."""

    heading: str
    layers: Mapping[str, np.ndarray]
    limit: float | np.ndarray
    limit_label: str
    ymax: float


def step_panels(panels: Sequence[StepPanel], edges_h: np.ndarray, *, title: str,
                ylabel: str, colors: Mapping[str, str], xlim: tuple[float, float],
                xlabel: str = "time since the trace's start (hours)",
                empty: str = "nothing to show") -> Any:
    """A figure with one row per panel, all sharing the time axis (hours): each
    panel's layers as a stacked step area, its limit as a black step line.

    Panels are independent (each stacks only its own layers), so one panel's
    series emptying never moves another's bands. The legend lists every label in
    `colors`, in that order, whether or not a panel draws it, so that figures
    built with the same colours have the same legend."""
    rows = max(1, len(panels))
    fig = _figure((7.2, 1.0 + 1.55 * rows))
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    edges = np.asarray(edges_h, dtype=float)
    for ax, panel in zip(axes, panels, strict=False):
        _draw_panel(ax, panel, edges, colors, ylabel)
    if not panels:
        _no_data(axes[0], empty)
    axes[0].set_xlim(*xlim)
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(title, fontsize="medium")
    _panel_legend(fig, colors, panels)
    return fig


def _draw_panel(ax: Any, panel: StepPanel, edges: np.ndarray, colors: Mapping[str, str],
                ylabel: str) -> None:
    # A post-step series needs its last value repeated at the closing edge.
    def closed(v: np.ndarray) -> np.ndarray:
        return np.append(v, v[-1]) if v.size else v

    drawn = [(label, v) for label, v in panel.layers.items() if np.any(v > 0)]
    if drawn and edges.size > 1:
        ax.stackplot(edges, *(closed(np.asarray(v, dtype=float)) for _, v in drawn),
                     colors=[colors.get(label, _GREY) for label, _ in drawn],
                     step="post", linewidth=0)
    limit = np.broadcast_to(np.asarray(panel.limit, dtype=float), (max(edges.size - 1, 1),))
    limit_x = edges if edges.size > 1 else np.asarray([0.0, 1.0])
    (line,) = ax.step(limit_x, closed(np.asarray(limit)), where="post", color="black",
                      linestyle="--", linewidth=1.2, label=panel.limit_label)
    line.set_gid("limit")
    ax.set_ylim(0, panel.ymax)
    ax.set_ylabel(ylabel)
    ax.set_title(panel.heading, loc="left", fontsize="small")
    ax.grid(True, alpha=0.3)


def _panel_legend(fig: Any, colors: Mapping[str, str], panels: Sequence[StepPanel]) -> None:
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = [Patch(facecolor=c, label=label) for label, c in colors.items()]
    limit_labels = dict.fromkeys(p.limit_label for p in panels)
    handles += [Line2D([], [], color="black", linestyle="--", label=label)
                for label in limit_labels]
    if handles:
        # Below the panels: beside them it would take a third of a column's width.
        fig.legend(handles=handles, loc="outside lower center", fontsize="small",
                   ncols=min(len(handles), 4), frameon=False)


# ------------------------------------------------------ allocation over time


def binned_mean(starts: np.ndarray, ends: np.ndarray, values: np.ndarray,
                edges: np.ndarray) -> np.ndarray:
    """Time-weighted mean of piecewise-constant series over each bin.

    Row values[i] (one value per series; a 1-D `values` is one series) holds on
    [starts[i], ends[i]), and every series is 0 outside the intervals, which are
    sorted and do not overlap.
    Returns one row per bin (len(edges) - 1 rows, one column per series). A bin's
    mean × its width is the series' integral over it, so binning neither loses
    nor invents a GPU-second."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    values = np.asarray(values, dtype=float)
    values = values[:, None] if values.ndim == 1 else values
    edges = np.asarray(edges, dtype=float)
    out = np.zeros((max(edges.size - 1, 0), values.shape[1]))
    if not starts.size or edges.size < 2:
        return out
    # The running integral rises linearly within each interval and is flat between
    # them: sample it at the bin edges and take differences.
    knots = np.column_stack([starts, ends]).ravel()
    after = np.cumsum(values * (ends - starts)[:, None], axis=0)
    before = np.vstack([np.zeros((1, values.shape[1])), after[:-1]])
    integral = np.stack([before, after], axis=1).reshape(knots.size, values.shape[1])
    for col in range(values.shape[1]):
        out[:, col] = np.diff(np.interp(edges, knots, integral[:, col])) / np.diff(edges)
    return out


def _holding(result: SimResult, fallback_s: float) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each round's allocation: a round's GPUs are held until the
    next round or one round length, whichever is first (jobs finishing inside a
    round hold their GPUs until it ends)."""
    starts = np.asarray([r.time for r in result.rounds], dtype=float)
    length = round_length(result) or fallback_s
    ends = np.minimum(starts + length, np.append(starts[1:], np.inf))
    return starts, ends


def _run_end_s(result: SimResult) -> float:
    """Where the run's time axis ends: its last finish or, cut short, its last
    round's start (as the makespan in `sim.metrics`)."""
    ends = [j.finish_time for j in result.jobs if j.finish_time is not None]
    if any(j.finish_time is None for j in result.jobs) or not ends:
        ends += [r.time for r in result.rounds[-1:]]
    return max([0.0, *ends])


def _gpu_types(results: Sequence[SimResult]) -> tuple[str, ...]:
    """GPU types with capacity or use in any run, in the clusters' order."""
    types = [t for r in results for t in r.capacity]
    types += [t for r in results for rnd in r.rounds for t, n in rnd.gpus_in_use.items() if n]
    return tuple(dict.fromkeys(types))


def _layer_labels(results: Sequence[SimResult]) -> tuple[str, ...]:
    """Stack layers: the runs' applications, sorted (the same order and colour in
    every figure), and the unattributed remainder if some round has one."""
    apps = sorted({j.application for r in results for j in r.jobs})
    rest = any(_unattributed(r) for r in results)
    return (*apps, *([_UNATTRIBUTED] if rest else []))


def _unattributed(result: SimResult) -> bool:
    return any(sum(g for _, g in rnd.allocations.values()) < sum(rnd.gpus_in_use.values())
               for rnd in result.rounds)


@dataclass(frozen=True)
class AllocationFrame:
    """What every allocation figure of one workload shares, so that the figures of
    its policies can be compared side by side: the time axis from 0 to the longest
    run's end, one bin width, each GPU type's panel and y range, the layer colours."""

    end_h: float
    bin_s: float
    gpu_types: tuple[str, ...]
    capacity: Mapping[str, int]
    ymax: Mapping[str, float]
    colors: Mapping[str, str]

    @property
    def edges_h(self) -> np.ndarray:
        n = max(1, math.ceil(self.end_h * _HOUR / self.bin_s - 1e-9))
        return np.arange(n + 1) * self.bin_s / _HOUR


def allocation_frame(results: Sequence[SimResult],
                     labels: Sequence[str] | None = None) -> AllocationFrame:
    """The frame for one workload's runs (one per policy). Bins are a whole
    number of the longest run's rounds (Gavel's 6 min beside Sia's 1 min), as
    few rounds as keep the figure under `_MAX_BINS` bins: averaging over whole
    rounds smooths the round-to-round churn without shifting any change by more
    than a bin. `labels` fixes the layers and their colours (pass the same to
    every workload's frame so an application keeps its colour across figures)."""
    end_s = max([_run_end_s(r) for r in results] + [0.0])
    round_s = max([round_length(r) or 0.0 for r in results]) or 60.0
    rounds_per_bin = max(1, math.ceil(end_s / (_MAX_BINS * round_s)))
    types = _gpu_types(results)
    capacity = {t: max([int(r.capacity.get(t, 0)) for r in results] + [0]) for t in types}
    peak = {t: max([rnd.gpus_in_use.get(t, 0) for r in results for rnd in r.rounds] + [0])
            for t in types}
    layer_labels = tuple(labels) if labels is not None else _layer_labels(results)
    return AllocationFrame(
        end_h=end_s / _HOUR if end_s > 0 else 1.0,
        bin_s=rounds_per_bin * round_s,
        gpu_types=types,
        capacity=capacity,
        ymax={t: _HEADROOM * max(1, capacity[t], peak[t]) for t in types},
        colors={label: _GREY if label == _UNATTRIBUTED else
                _LAYER_COLORS[i % len(_LAYER_COLORS)] for i, label in enumerate(layer_labels)})


def allocation_panels(result: SimResult, frame: AllocationFrame) -> list[StepPanel]:
    """One panel per GPU type of `frame`: the GPUs of that type allocated to each
    application, as the mean over each time bin, against the type's capacity."""
    app = {j.name: j.application for j in result.jobs}
    types, labels = frame.gpu_types, list(frame.colors)
    col = {(t, label): i * len(labels) + k
           for i, t in enumerate(types) for k, label in enumerate(labels)}
    per_round = np.zeros((len(result.rounds), len(col)))
    for n, rnd in enumerate(result.rounds):
        attributed = dict.fromkeys(types, 0)
        for job, (t, gpus) in rnd.allocations.items():
            key = (t, app.get(job, _UNATTRIBUTED))
            if key in col:
                per_round[n, col[key]] += gpus
                attributed[t] += gpus
        for t in types:
            rest = rnd.gpus_in_use.get(t, 0) - attributed[t]
            if rest > 0 and (t, _UNATTRIBUTED) in col:
                per_round[n, col[(t, _UNATTRIBUTED)]] += rest
    starts, ends = _holding(result, frame.bin_s)
    binned = binned_mean(starts, ends, per_round, frame.edges_h * _HOUR)
    return [StepPanel(heading=f"{t}: {frame.capacity[t]} GPUs",
                      layers={label: binned[:, col[(t, label)]] for label in labels},
                      limit=float(frame.capacity[t]), limit_label="capacity",
                      ymax=frame.ymax[t])
            for t in types]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def allocation_figure(result: SimResult, frame: AllocationFrame | None = None) -> Any:
    """GPUs allocated over time, one panel (row) per GPU type, stacked by
    application, against the type's capacity.

    One figure per run rather than one grid of every policy: a figure stays
    legible at a paper's column width however many policies are compared, and
    stands alone; passing every policy's figure the same `frame` (as `write_all`
    does) gives them identical axes, so they still compare side by side."""
    frame = frame or allocation_frame([result])
    title = (f"GPUs allocated by type: {result.policy} on "
             f"{_workload_label(result.workload)}, cluster {result.cluster}\n"
             f"(mean over {_minutes(frame.bin_s)} bins, stacked by application)")
    return step_panels(allocation_panels(result, frame), frame.edges_h, title=title,
                       ylabel="GPUs", colors=frame.colors, xlim=(0.0, frame.end_h),
                       empty="no GPU types")


def allocation_over_time(result: SimResult, path: str | Path,
                         frame: AllocationFrame | None = None) -> Path:
    """`allocation_figure`, saved as PNG at `path`."""
    return _save(allocation_figure(result, frame), path)


# ------------------------------------------------------ queues over time

# The layers of a queue's panel: what it holds up to its guarantee, what it holds
# beyond (borrowed idle capacity), and what it was owed and not given (stacked on
# top of what it holds, so the stack reaches what it was owed).
_QUEUE_COLORS = {"held within guarantee": "#66c2a5", "borrowed (beyond guarantee)": "#8da0cb",
                 "owed, not held": "#e41a1c"}


def _queue_keys(result: SimResult, frame: AllocationFrame) -> list[tuple[str, str]]:
    """(queue, GPU type or units) of every panel: the types a queue is guaranteed or
    ever holds, its units if it has a type-flexible guarantee; queues with neither
    jobs nor guarantees (an unused `default`) have none."""
    used = {(q, t) for r in result.rounds for q, h in r.held.items() for t, n in h.items() if n}
    keys = []
    for q, spec in result.queues.items():
        keys += [(q, t) for t in frame.gpu_types if spec.guarantee.get(t, 0) or (q, t) in used]
        if spec.guarantee_units:
            keys.append((q, UNITS))
    return keys


def queue_panels(result: SimResult, frame: AllocationFrame) -> list[StepPanel]:
    """One panel per queue and GPU type (`_queue_keys`): the GPUs the queue held, as
    the mean over each time bin, split at its guarantee, and what it was owed and
    not held, against its guarantee. Each panel's y range is the type's capacity
    (units: the whole cluster's), so the figures of every policy share it."""
    keys = _queue_keys(result, frame)
    weight = {t: float(result.unit_weights.get(t, 1.0)) for t in frame.gpu_types}
    per_round = np.zeros((len(result.rounds), 3 * len(keys)))
    for n, rnd in enumerate(result.rounds):
        for k, (q, key) in enumerate(keys):
            gpus = rnd.held.get(q, {})
            held = (sum(weight.get(t, 1.0) * g for t, g in gpus.items()) if key == UNITS
                    else float(gpus.get(key, 0)))
            owed = float(((rnd.owed or {}).get(q) or {}).get(key, 0.0))
            g = _guarantee(result, q, key)
            per_round[n, 3 * k:3 * k + 3] = (min(held, g), max(held - g, 0.0),
                                             max(owed - held, 0.0))
    starts, ends = _holding(result, frame.bin_s)
    binned = binned_mean(starts, ends, per_round, frame.edges_h * _HOUR)
    panels = []
    for k, (q, key) in enumerate(keys):
        g = _guarantee(result, q, key)
        top = (sum(weight[t] * frame.capacity[t] for t in frame.gpu_types) if key == UNITS
               else frame.capacity.get(key, 0))
        unit = "units" if key == UNITS else "GPUs"
        panels.append(StepPanel(
            heading=f"{q} · {key}: guarantee {g:g} {unit}",
            layers=dict(zip(_QUEUE_COLORS, binned[:, 3 * k:3 * k + 3].T, strict=True)),
            limit=g, limit_label="guarantee", ymax=_HEADROOM * max(1.0, top, g)))
    return panels


def _guarantee(result: SimResult, queue: str, key: str) -> float:
    spec = result.queues[queue]
    return float(spec.guarantee_units if key == UNITS else spec.guarantee.get(key, 0))


def queue_figure(result: SimResult, frame: AllocationFrame | None = None) -> Any:
    """GPUs held per queue over time against its guarantee, one panel (row) per
    queue and GPU type (`queue_panels`); for a run with queues."""
    frame = frame or allocation_frame([result])
    title = (f"GPUs held per queue: {result.policy} on {_workload_label(result.workload)}, "
             f"cluster {result.cluster}\n(mean over {_minutes(frame.bin_s)} bins; "
             f"guarantee dashed)")
    return step_panels(queue_panels(result, frame), frame.edges_h, title=title,
                       ylabel="GPUs", colors=_QUEUE_COLORS, xlim=(0.0, frame.end_h),
                       empty="no queues with guarantees or jobs")


def queue_figures(results_by_policy: Mapping[str, Sequence[SimResult]],
                  ) -> Iterator[tuple[str, str, Any]]:
    """(workload, policy, figure) of `queue_figure` for every run with queues; the
    figures of one workload share one frame (time axis and bins)."""
    by_workload: dict[str, list[tuple[str, SimResult]]] = {}
    for policy, results in results_by_policy.items():
        for r in results:
            if r.queues:
                by_workload.setdefault(r.workload, []).append((policy, r))
    for runs in by_workload.values():
        frame = allocation_frame([r for _, r in runs])
        for policy, r in runs:
            yield r.workload, policy, queue_figure(r, frame)


def safe_name(name: str) -> str:
    """`name` made safe as part of a file name."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._")
    return s or "unnamed"


def allocation_figures(results_by_policy: Mapping[str, Sequence[SimResult]],
                       ) -> Iterator[tuple[str, str, Any]]:
    """(workload, policy, figure) of `allocation_figure` for every run, one at a
    time (a figure holds its data until dropped). The figures of one workload
    share one frame, and an application has the same colour in every figure."""
    by_workload: dict[str, list[tuple[str, SimResult]]] = {}
    for policy, results in results_by_policy.items():
        for r in results:
            by_workload.setdefault(r.workload, []).append((policy, r))
    labels = _layer_labels(_pooled(results_by_policy))
    for workload, runs in by_workload.items():
        frame = allocation_frame([r for _, r in runs], labels)
        for policy, r in runs:
            yield workload, policy, allocation_figure(r, frame)


def write_all(results_by_policy: Mapping[str, Sequence[SimResult]],
              out_dir: str | Path) -> list[Path]:
    """Write jct_cdf.png, ftf_cdf.png, allocation_<policy>_<workload>.png for every
    run (`allocation_figures`) and, for runs with queues,
    queues_<policy>_<workload>.png (`queue_figures`) into out_dir; returns the paths
    written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [jct_cdf(results_by_policy, out / "jct_cdf.png"),
             ftf_cdf(results_by_policy, out / "ftf_cdf.png")]
    used: set[str] = set()
    figures = itertools.chain(
        (("allocation", *f) for f in allocation_figures(results_by_policy)),
        (("queues", *f) for f in queue_figures(results_by_policy)))
    for kind, workload, policy, fig in figures:
        stem = f"{kind}_{safe_name(policy)}_{safe_name(workload)}"
        name, k = stem, 1
        while name in used:  # two names that sanitise alike
            k += 1
            name = f"{stem}_{k}"
        used.add(name)
        paths.append(_save(fig, out / f"{name}.png"))
    return paths
