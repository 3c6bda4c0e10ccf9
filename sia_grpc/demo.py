"""`sia demo` (what `make demo` runs until the live control plane exists):
Sia rounds for the paper's heterogeneous 64-GPU cluster and a sample of jobs in
the Helios mix, printed as readable tables."""

from __future__ import annotations

import numpy as np

from sia_grpc.policy.cluster import Cluster, paper_hetero_cluster
from sia_grpc.policy.sia import SiaPolicy
from sia_grpc.policy.types import RoundResult
from sia_grpc.scenarios import run_rounds, sample_jobs

# The artifact's names for the paper's GPU types.
PAPER_NAMES = {"aws": "t4", "rtx": "rtx", "dgx-ext": "a100"}


def format_round(cluster: Cluster, job_ids: list[str], result: RoundResult) -> str:
    rows = [("job", "GPUs", "type", "nodes", "batch", "accum", "goodput/s", "decision")]
    for j in job_ids:
        a = result.allocations.get(j)
        if a is None:
            rows.append((j, "0", "-", "-", "-", "-", "-", result.reasons.get(j, "")))
            continue
        t = a.config.gpu_type
        nodes = len({g.node for g in a.gpus})
        rows.append((j, str(a.config.num_gpus), f"{t} ({PAPER_NAMES.get(t, t)})", str(nodes),
                     str(a.batch_size), str(a.accum_steps), f"{a.goodput:,.0f}",
                     result.reasons.get(j, "")))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    used = {t: 0 for t in cluster.gpu_types}
    for a in result.allocations.values():
        used[a.config.gpu_type] += a.config.num_gpus
    usage = ", ".join(f"{t}: {used[t]}/{cluster.capacity[t]}" for t in cluster.gpu_types)
    tm = result.timings
    lines.append(f"GPUs in use — {usage}; restarts this round: {len(result.restarted)}")
    lines.append("policy time: " + ", ".join(
        f"{k} {tm[k] * 1e3:.1f} ms" for k in ("estimate", "build", "solve", "place", "total")))
    return "\n".join(lines)


def run_demo(num_jobs: int = 16, rounds: int = 4, seed: int = 1) -> int:
    cluster = paper_hetero_cluster()
    print("Cluster (the paper's heterogeneous setting): "
          + ", ".join(f"{len(cluster.vnodes[t])} x {cluster.gpus_per_vnode[t]} {t} "
                      f"({PAPER_NAMES.get(t, t)})" for t in cluster.gpu_types)
          + f" = {cluster.total_gpus} GPUs")
    jobs = sample_jobs(np.random.default_rng(seed), num_jobs, cluster)
    print(f"{num_jobs} jobs in the Helios mix; goodput models bootstrapped from the "
          "artifact's 1-GPU profiles.\nNew jobs start on 1 GPU and may at most double "
          "each 60 s round.\n")
    ids = [j.job_id for j in jobs]
    for k, step in enumerate(run_rounds(SiaPolicy(), cluster, jobs, rounds), start=1):
        print(f"Round {k}")
        print(format_round(cluster, ids, step.result))
        print()
    return 0
