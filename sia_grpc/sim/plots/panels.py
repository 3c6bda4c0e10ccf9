"""Step series against a limit, one panel per row on a shared time axis (the layout
of the allocation and queue figures), and `binned_mean`, which turns per-round
records into the per-bin series those panels draw."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sia_grpc.sim.plots.canvas import GREY, new_figure, no_data


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
    fig = new_figure((7.2, 1.0 + 1.55 * rows))
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    edges = np.asarray(edges_h, dtype=float)
    for ax, panel in zip(axes, panels, strict=False):
        _draw_panel(ax, panel, edges, colors, ylabel)
    if not panels:
        no_data(axes[0], empty)
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
                     colors=[colors.get(label, GREY) for label, _ in drawn],
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
