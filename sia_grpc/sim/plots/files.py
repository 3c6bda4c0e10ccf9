"""Every figure of a set of runs written as PNG files into one folder, under names
made from the figure's kind, policy and workload (`safe_name`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from sia_grpc.sim.plots.allocation import allocation_figures
from sia_grpc.sim.plots.canvas import save
from sia_grpc.sim.plots.cdfs import ftf_cdf, jct_cdf
from sia_grpc.sim.plots.queues import queue_figures
from sia_grpc.sim.records import SimResult


def safe_name(name: str) -> str:
    """`name` made safe as part of a file name."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._")
    return s or "unnamed"


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
        paths.append(save(fig, out / f"{name}.png"))
    return paths
