"""What every figure shares: a matplotlib figure on the Agg canvas (no pyplot, so no
global backend or figure state is touched), PNG saving, the labels that name runs in
titles, and the constants of the house style (headroom, grey, hours)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sia_grpc.sim.records import SimResult

HOUR = 3600.0
HEADROOM = 1.12  # y range above a panel's limit line, room for its heading
GREY = "#b3b3b3"  # what no policy or application owns (an unattributed remainder)


def new_figure(figsize: tuple[float, float] = (6.4, 4.0)) -> Any:
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


def save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, format="png")
    return path


def no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="gray")


def minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def workload_label(workload: str) -> str:
    """A shipped name as is ("saturn/workload-1"); a CSV path as its last folder
    and stem ("mytraces/day-3"), which is what tells two runs apart."""
    p = Path(workload)
    if p.suffix.lower() != ".csv":
        return workload
    return f"{p.parent.name}/{p.stem}" if p.parent.name else p.stem


def runs_label(results: Sequence[SimResult]) -> str:
    """What a figure of pooled runs shows: "saturn/workload-1, cluster hetero64x1",
    or for several workloads their trace groups, "philly, saturn (9 workloads
    pooled), cluster hetero64x1"."""
    workloads = list(dict.fromkeys(workload_label(r.workload) for r in results))
    clusters = ", ".join(dict.fromkeys(r.cluster for r in results)) or "none"
    if not workloads:
        return f"no runs, cluster {clusters}"
    if len(workloads) == 1:
        return f"{workloads[0]}, cluster {clusters}"
    groups = ", ".join(dict.fromkeys(w.split("/")[0] for w in workloads))
    return f"{groups} ({len(workloads)} workloads pooled), cluster {clusters}"


def pooled(results_by_policy: Mapping[str, Sequence[SimResult]]) -> list[SimResult]:
    """Every run of every policy, in order."""
    return [r for results in results_by_policy.values() for r in results]
