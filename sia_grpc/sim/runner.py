"""`sia simulate`: run workloads under policies, in parallel processes, with
progress on stderr and a table (and optional JSON and plots) at the end."""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from sia_grpc.policy import make_policy
from sia_grpc.sim.clusters import load_cluster
from sia_grpc.sim.engine import SimConfig, simulate
from sia_grpc.sim.records import SimResult
from sia_grpc.sim.workload import load_workload, shipped_workloads


def resolve_workloads(items: Sequence[str]) -> list[str]:
    """CSV paths, directories of CSVs, shipped names ("saturn/workload-1") or
    shipped groups ("saturn") → a list of workload references."""
    out: list[str] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p) for p in path.glob("*.csv"))
            if not found:
                raise ValueError(f"workload: no .csv files in directory {item!r}")
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        elif item in shipped_workloads():
            out.append(item)
        else:
            try:
                out.extend(shipped_workloads(item))
            except ValueError:
                raise ValueError(f"workload: {item!r} is not a file, a directory, or a "
                                 f"shipped workload (e.g. saturn, saturn/workload-1)") from None
    return out


def run_one(workload: str, policy: str, cluster: str, scale: int) -> SimResult:
    trace = load_workload(workload)
    return simulate(trace, load_cluster(cluster, scale=scale), make_policy(policy),
                    workload_name=workload, cluster_name=f"{cluster}x{scale}",
                    config=SimConfig())


def run(workloads: Sequence[str], policies: Sequence[str], cluster: str, scale: int,
        processes: int, json_out: str | None, plots: str | None) -> int:
    from sia_grpc.sim import metrics

    refs = resolve_workloads(workloads)
    for p in policies:
        make_policy(p)  # fail fast on a bad name
    load_cluster(cluster, scale=scale)
    tasks = [(w, p) for p in policies for w in refs]
    results: dict[tuple[str, str], SimResult] = {}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, processes), mp_context=ctx) as pool:
        futures = {pool.submit(run_one, w, p, cluster, scale): (w, p) for w, p in tasks}
        for done, fut in enumerate(as_completed(futures), start=1):
            w, p = futures[fut]
            results[(w, p)] = fut.result()
            r = results[(w, p)]
            print(f"[{done}/{len(tasks)}] {p} on {w}: {len(r.rounds)} rounds, "
                  f"{r.cpu_seconds:.1f} CPU-s", file=sys.stderr, flush=True)
    table_rows: dict[str, object] = {}
    per_policy: dict[str, list] = {p: [] for p in policies}
    for p in policies:
        for w in refs:
            m = metrics.compute(results[(w, p)])
            per_policy[p].append(m)
            table_rows[f"{p} {w}"] = m
        if len(refs) > 1:
            table_rows[f"{p} (mean ± std)"] = metrics.summarize(per_policy[p])
    print(metrics.format_table(table_rows))
    if json_out:
        payload = [metrics.to_json(results[t], metrics.compute(results[t])) for t in tasks]
        Path(json_out).write_text(json.dumps(payload, indent=2, default=_plain))
    if plots:
        from sia_grpc.sim import plots as plotting

        by_policy = {p: [results[(w, p)] for w in refs] for p in policies}
        for path in plotting.write_all(by_policy, plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _plain(obj):
    try:
        return asdict(obj)
    except TypeError:
        return str(obj)


# The paper's simulator (Pollux's, as modified for Sia) on one core, as the
# issue quotes it: ~200 CPU-s for a 160-job, 8-hour Helios (saturn) workload with
# Sia, and over an hour for a 960-job, 48-hour newTrace workload.
PAPER_SIM_CPU_S = {"saturn": 200.0, "newtrace": 3600.0}


def bench(workloads: Sequence[str], policy: str, cluster: str) -> int:
    """`sia bench sim`: CPU-seconds per workload, one at a time in this process."""
    rows = []
    for w in resolve_workloads(workloads):
        print(f"simulating {w} with {policy} ...", file=sys.stderr, flush=True)
        r = run_one(w, policy, cluster, 1)
        group = w.split("/")[0]
        ref = PAPER_SIM_CPU_S.get(group)
        rows.append((w, len(r.jobs), len(r.rounds), r.cpu_seconds, r.wall_seconds, ref))
    head = ("| workload | jobs | rounds | CPU s | wall s | paper's simulator CPU s | speed-up |\n"
            "|---|---|---|---|---|---|---|")
    print(head)
    for w, n, k, cpu, wall, ref in rows:
        ratio = f"≥ {ref / cpu:.0f}x" if ref and w.startswith("newtrace") else (
            f"{ref / cpu:.0f}x" if ref else "—")
        print(f"| {w} | {n} | {k} | {cpu:.1f} | {wall:.1f} | "
              f"{'> ' if w.startswith('newtrace') else ''}{ref or '—'} | {ratio} |")
    return 0
