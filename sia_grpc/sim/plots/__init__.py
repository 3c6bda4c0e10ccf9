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

The modules hold the parts:

  canvas.py      the Agg figure, PNG saving, run labels for titles, shared style
  cdfs.py        the JCT and finish-time-fairness CDFs
  panels.py      `StepPanel` rows against a limit line, `binned_mean`
  allocation.py  GPUs allocated per type over time, `AllocationFrame`
  queues.py      GPUs held per queue over time against its guarantee
  files.py       `write_all`: every figure of a set of runs as PNG files
"""

from __future__ import annotations

from sia_grpc.sim.plots.allocation import (
    AllocationFrame,
    allocation_figure,
    allocation_figures,
    allocation_frame,
    allocation_over_time,
    allocation_panels,
)
from sia_grpc.sim.plots.cdfs import ftf_cdf, ftf_cdf_figure, jct_cdf, jct_cdf_figure
from sia_grpc.sim.plots.files import safe_name, write_all
from sia_grpc.sim.plots.panels import StepPanel, binned_mean, step_panels
from sia_grpc.sim.plots.queues import queue_figure, queue_figures, queue_panels

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
