"""GPUs held per queue and GPU type over time against the queue's guarantee, for runs
with queues: what each queue held within its guarantee, what it borrowed beyond it,
and what it was owed and not given."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from sia_grpc.policy.queues.measures import UNITS
from sia_grpc.sim.plots.allocation import AllocationFrame, allocation_frame, holding
from sia_grpc.sim.plots.canvas import HEADROOM, HOUR, minutes, workload_label
from sia_grpc.sim.plots.panels import StepPanel, binned_mean, step_panels
from sia_grpc.sim.records import SimResult

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
    starts, ends = holding(result, frame.bin_s)
    binned = binned_mean(starts, ends, per_round, frame.edges_h * HOUR)
    panels = []
    for k, (q, key) in enumerate(keys):
        g = _guarantee(result, q, key)
        top = (sum(weight[t] * frame.capacity[t] for t in frame.gpu_types) if key == UNITS
               else frame.capacity.get(key, 0))
        unit = "units" if key == UNITS else "GPUs"
        panels.append(StepPanel(
            heading=f"{q} · {key}: guarantee {g:g} {unit}",
            layers=dict(zip(_QUEUE_COLORS, binned[:, 3 * k:3 * k + 3].T, strict=True)),
            limit=g, limit_label="guarantee", ymax=HEADROOM * max(1.0, top, g)))
    return panels


def _guarantee(result: SimResult, queue: str, key: str) -> float:
    spec = result.queues[queue]
    return float(spec.guarantee_units if key == UNITS else spec.guarantee.get(key, 0))


def queue_figure(result: SimResult, frame: AllocationFrame | None = None) -> Any:
    """GPUs held per queue over time against its guarantee, one panel (row) per
    queue and GPU type (`queue_panels`); for a run with queues."""
    frame = frame or allocation_frame([result])
    title = (f"GPUs held per queue: {result.policy} on {workload_label(result.workload)}, "
             f"cluster {result.cluster}\n(mean over {minutes(frame.bin_s)} bins; "
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
