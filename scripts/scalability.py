"""The paper's scalability study from `sia simulate --json` outputs: a markdown table
and a figure of average JCT and policy time per round against the cluster's size
(`scale/scale_<k>x`, with saturn/workload-1 as 1×) and the arrival rate
(`scale/rate_<r>`), one line per policy.

    .venv/bin/python scripts/scalability.py --png docs/img/scalability.png RUNS.json...

A point is the mean over the workloads run for it (rate_<r> ships two); a run left
out (not in any RUNS.json) is simply not drawn. How the runs were made:
docs/journal/results.md, "The paper's scalability study" (today's table: docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from sia_grpc.sim.plots import _figure, _save  # the project's canvas and PNG conventions

POLICIES = ("sia", "sia-plus", "pollux", "gavel")
FIELDS = ("avg_jct_h", "p99_jct_h", "contention_mean", "policy_ms_median", "policy_ms_p95")


def _point(run: dict) -> tuple[str, float] | None:
    """("size", GPUs) or ("rate", jobs per hour) of a run; None for other runs."""
    w = run["workload"]
    gpus = float(sum(run["capacity"].values()))
    if re.fullmatch(r"scale/scale_\d+x/workload-\d+|saturn/workload-1", w):
        return "size", gpus
    m = re.fullmatch(r"scale/rate_(\d+)/workload-\d+", w)
    return ("rate", float(m.group(1))) if m else None


def collect(paths: list[str]) -> dict:
    """(axis, x) → policy → field → values over the point's workloads, and CPU-s."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        for run in json.loads(Path(path).read_text()):
            key = _point(run)
            if key is None:
                continue
            cell = out[key][run["policy"]]
            for f in FIELDS:
                if run["metrics"].get(f) is not None:
                    cell[f].append(run["metrics"][f])
            cell["cpu_seconds"].append(run["cpu_seconds"])
            cell["jobs"].append(run["metrics"]["jobs"])
    return out


def table(data: dict) -> str:
    lines = ["| axis | point | policy | jobs | active jobs a round | avg JCT h | p99 JCT h | "
             "policy ms p50 | p95 | CPU s/run |", "|" + "---|" * 10]
    for axis, x in sorted(data, key=lambda k: (k[0] != "size", k[1])):  # sizes first
        for p in POLICIES:
            c = data[(axis, x)].get(p)
            if not c:
                continue
            point = f"{x:.0f} GPUs" if axis == "size" else f"{x:.0f} jobs/h"
            lines.append(
                f"| {axis} | {point} | {p} | {np.mean(c['jobs']):.0f} | "
                f"{np.mean(c['contention_mean']):.1f} | "
                f"{np.mean(c['avg_jct_h']):.3f} | {np.mean(c['p99_jct_h']):.2f} | "
                f"{np.mean(c['policy_ms_median']):.1f} | {np.mean(c['policy_ms_p95']):.1f} | "
                f"{np.mean(c['cpu_seconds']):.0f} |")
    return "\n".join(lines)


def figure(data: dict):
    fig = _figure(figsize=(10.0, 7.0))
    axes = fig.subplots(2, 2)
    for col, (axis, xlabel) in enumerate((("size", "GPUs (hetero64 × k; jobs × k)"),
                                          ("rate", "arrival rate, jobs per hour (64 GPUs)"))):
        xs = sorted(x for a, x in data if a == axis)
        for p in POLICIES:
            pts = [(x, data[(axis, x)][p]) for x in xs if data[(axis, x)].get(p)]
            if not pts:
                continue
            px = [x for x, _ in pts]
            line, = axes[0][col].plot(px, [np.mean(c["avg_jct_h"]) for _, c in pts],
                                      marker="o", label=p)
            axes[1][col].plot(px, [np.mean(c["policy_ms_median"]) for _, c in pts],
                              marker="o", color=line.get_color(), label=f"{p} p50")
            axes[1][col].plot(px, [np.mean(c["policy_ms_p95"]) for _, c in pts],
                              marker="x", linestyle="--", color=line.get_color(),
                              label=f"{p} p95")
        for row in (0, 1):
            ax = axes[row][col]
            ax.set_xlabel(xlabel)
            if axis == "size":
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:.0f}" for x in xs])
            ax.grid(True, alpha=0.3)
            if ax.get_lines():
                ax.legend(fontsize="small" if row == 0 else "x-small", ncol=1 + row)
        axes[0][col].set_ylabel("average JCT (hours)")
        axes[0][col].set_ylim(bottom=0)
        axes[1][col].set_ylabel("policy wall time per round (ms)")
        axes[1][col].set_yscale("log")
    axes[0][0].set_title("cluster and jobs scaled alike (saturn/workload-1 × k)")
    axes[0][1].set_title("arrival rate (scale/rate_*, mean of 2 workloads)")
    fig.suptitle("Scalability study, simulator, shipped policy settings "
                 "(policy time: wall, on a shared 2-core machine)")
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUNS.json")
    ap.add_argument("--png", metavar="OUT.png")
    args = ap.parse_args(argv)
    data = collect(args.runs)
    print(table(data))
    if args.png:
        print(f"wrote {_save(figure(data), args.png)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
