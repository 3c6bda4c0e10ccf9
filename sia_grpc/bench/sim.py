"""`sia bench sim`: the CPU time of simulating whole workloads, beside the paper's
simulator (docs/benchmarks.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sia_grpc.sim.progress import Reporter, make_display
from sia_grpc.sim.records import SimResult
from sia_grpc.sim.runner import Variant, resolve_workloads, run_one

# The paper's simulator (Pollux's, as modified for Sia) on one core, as the
# issue quotes it: ~200 CPU-s for a 160-job, 8-hour Helios (saturn) workload with
# Sia, and over an hour for a 960-job, 48-hour newTrace workload.
PAPER_SIM_CPU_S = {"saturn": 200.0, "newtrace": 3600.0}


def run(workloads: Sequence[str], policy: str, cluster: str, scale: int = 1) -> int:
    """CPU-seconds per workload, one at a time in this process, on `cluster` with
    every type's nodes times `scale` (as `sia simulate --scale`). Progress on stderr as
    `sia simulate`'s (sia_grpc.sim.progress), drawn only on a run's rate-limited
    reports: no refresh thread adds to the CPU time measured."""
    rows = []
    refs = resolve_workloads(workloads)
    display = make_display(sys.stderr, len(refs), auto_refresh=False)
    try:
        for key, w in enumerate(refs):
            display.log(f"simulating {w} with {policy} on {cluster}x{scale} ...")
            display.start(key, f"{policy} on {w}")
            r = run_one(w, Variant(policy, {}), cluster, scale,
                        on_progress=Reporter(display.update, key))
            display.finish(key, f"[{key + 1}/{len(refs)}] {policy} on {w}: "
                                f"{len(r.rounds)} rounds, {r.cpu_seconds:.1f} CPU-s")
            rows.append(_row(w, r, scale))
    finally:
        display.close()
    _print_table(rows)
    return 0


def _row(w: str, r: SimResult, scale: int) -> tuple:
    # The paper's figure is for its own traces on its 64-GPU cluster only.
    ref = PAPER_SIM_CPU_S.get(w.split("/")[0]) if scale == 1 else None
    return (w, len(r.jobs), sum(r.capacity.values()), len(r.rounds), r.cpu_seconds,
            r.wall_seconds, ref)


def _print_table(rows: list[tuple]) -> None:
    head = ("| workload | jobs | GPUs | rounds | CPU s | wall s | paper's simulator CPU s | "
            "speed-up |\n|---|---|---|---|---|---|---|---|")
    print(head)
    for w, n, gpus, k, cpu, wall, ref in rows:
        ratio = f"≥ {ref / cpu:.0f}x" if ref and w.startswith("newtrace") else (
            f"{ref / cpu:.0f}x" if ref else "—")
        print(f"| {w} | {n} | {gpus} | {k} | {cpu:.1f} | {wall:.1f} | "
              f"{'> ' if ref and w.startswith('newtrace') else ''}{ref or '—'} | {ratio} |")
