"""GPUs allocated over time, one panel per GPU type, stacked by application (like the
paper's Figure 5), and `AllocationFrame`: the time axis, bins and y ranges that the
figures of one workload share (the queue figures use it too), so that its policies'
figures compare side by side."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sia_grpc.sim.plots.canvas import (
    GREY,
    HEADROOM,
    HOUR,
    minutes,
    pooled,
    save,
    workload_label,
)
from sia_grpc.sim.plots.panels import StepPanel, binned_mean, step_panels
from sia_grpc.sim.records import SimResult, round_length

_MAX_BINS = 160  # time bins per allocation figure: legible steps at a column's width
UNATTRIBUTED = "(not recorded per job)"  # GPUs in use that no per-job allocation explains
# Layer colours (ColorBrewer Set2): not the default cycle, which the CDFs use for
# policies, so that no colour reads as a policy in one figure and an application
# in the next. The unattributed remainder is grey.
_LAYER_COLORS = ("#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f", "#e5c494")


def holding(result: SimResult, fallback_s: float) -> tuple[np.ndarray, np.ndarray]:
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
    return (*apps, *([UNATTRIBUTED] if rest else []))


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
        n = max(1, math.ceil(self.end_h * HOUR / self.bin_s - 1e-9))
        return np.arange(n + 1) * self.bin_s / HOUR


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
        end_h=end_s / HOUR if end_s > 0 else 1.0,
        bin_s=rounds_per_bin * round_s,
        gpu_types=types,
        capacity=capacity,
        ymax={t: HEADROOM * max(1, capacity[t], peak[t]) for t in types},
        colors={label: GREY if label == UNATTRIBUTED else
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
            key = (t, app.get(job, UNATTRIBUTED))
            if key in col:
                per_round[n, col[key]] += gpus
                attributed[t] += gpus
        for t in types:
            rest = rnd.gpus_in_use.get(t, 0) - attributed[t]
            if rest > 0 and (t, UNATTRIBUTED) in col:
                per_round[n, col[(t, UNATTRIBUTED)]] += rest
    starts, ends = holding(result, frame.bin_s)
    binned = binned_mean(starts, ends, per_round, frame.edges_h * HOUR)
    return [StepPanel(heading=f"{t}: {frame.capacity[t]} GPUs",
                      layers={label: binned[:, col[(t, label)]] for label in labels},
                      limit=float(frame.capacity[t]), limit_label="capacity",
                      ymax=frame.ymax[t])
            for t in types]


def allocation_figure(result: SimResult, frame: AllocationFrame | None = None) -> Any:
    """GPUs allocated over time, one panel (row) per GPU type, stacked by
    application, against the type's capacity.

    One figure per run rather than one grid of every policy: a figure stays
    legible at a paper's column width however many policies are compared, and
    stands alone; passing every policy's figure the same `frame` (as `write_all`
    does) gives them identical axes, so they still compare side by side."""
    frame = frame or allocation_frame([result])
    title = (f"GPUs allocated by type: {result.policy} on "
             f"{workload_label(result.workload)}, cluster {result.cluster}\n"
             f"(mean over {minutes(frame.bin_s)} bins, stacked by application)")
    return step_panels(allocation_panels(result, frame), frame.edges_h, title=title,
                       ylabel="GPUs", colors=frame.colors, xlim=(0.0, frame.end_h),
                       empty="no GPU types")


def allocation_over_time(result: SimResult, path: str | Path,
                         frame: AllocationFrame | None = None) -> Path:
    """`allocation_figure`, saved as PNG at `path`."""
    return save(allocation_figure(result, frame), path)


def allocation_figures(results_by_policy: Mapping[str, Sequence[SimResult]],
                       ) -> Iterator[tuple[str, str, Any]]:
    """(workload, policy, figure) of `allocation_figure` for every run, one at a
    time (a figure holds its data until dropped). The figures of one workload
    share one frame, and an application has the same colour in every figure."""
    by_workload: dict[str, list[tuple[str, SimResult]]] = {}
    for policy, results in results_by_policy.items():
        for r in results:
            by_workload.setdefault(r.workload, []).append((policy, r))
    labels = _layer_labels(pooled(results_by_policy))
    for workload, runs in by_workload.items():
        frame = allocation_frame([r for _, r in runs], labels)
        for policy, r in runs:
            yield workload, policy, allocation_figure(r, frame)
