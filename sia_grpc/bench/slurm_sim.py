"""What `sia bench slurm` holds the bridge against besides Slurm alone: the
simulator's Sia on the same jobs and GPUs, each start and move charged what the
bridge's cost beyond the application's restore (`SimConfig.move_cost_s`), measured
in the same run (`slurm_stages`), averaged over where its rounds fall."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sia_grpc.nodeagent.gpus import gpu_type_for
from sia_grpc.sim.workload import TraceJob

__all__ = ["move_cost_s", "simulated"]


def move_cost_s(report: Mapping, scale: float) -> float:
    """What a start or move through the bridge cost beyond the application's restore,
    in modeled seconds: the median over the bridge's starts and moves of the round's
    latency and Slurm's side (`slurm_stages`), times the time scale."""
    stages = report.get("stages_s", {})
    costs = [s.get("decided", 0.0) + s["slurm_side"]
             for s in (*stages.get("moves", ()), *stages.get("starts", ()))]
    return float(np.median(costs)) * scale if costs else 0.0


# Where the simulator's rounds fall against the arrivals is arbitrary (the bridge's fall
# wherever the clock puts them): the prediction is the mean over this many phases.
PHASES = 8


def simulated(jobs: Sequence[TraceJob], scale: float, interval_s: float,
              move_cost: float, phases: int = PHASES) -> dict[str, Any]:
    """The simulator's Sia on the same jobs and the test cluster's 12 GPUs, with the
    bridge's rounds (`interval_s` x `scale` modeled seconds) and each start and move
    costing `move_cost` modeled seconds beyond the application's restore: what the
    bridge should come to if it adds nothing but that cost. The mean over `phases`
    runs with the rounds shifted by equal steps of a round against the arrivals (the
    average JCT ranged 1.84-1.93 h over them at 155 s), its range in
    `avg_jct_h_range`."""
    from sia_grpc.policy.cluster import Cluster, Node
    from sia_grpc.policy.params import make_policy
    from sia_grpc.sim.engine import SimConfig, simulate
    from sia_grpc.testing.slurm import DEFAULT_NODES

    cluster = Cluster.of(Node(name, gpu_type_for(gres), count)
                         for name, (gres, count) in DEFAULT_NODES.items())
    round_s = interval_s * scale
    runs = []
    for k in range(phases):
        shifted = [replace(j, time=j.time + round_s * k / phases) for j in jobs]
        result = simulate(shifted, cluster, make_policy("sia", round_duration=round_s),
                          config=SimConfig(move_cost_s=move_cost))
        jct = np.array([j.jct for j in result.jobs if j.jct is not None]) / 3600
        ends = [j.finish_time for j in result.jobs if j.finish_time is not None]
        runs.append({
            "avg_jct_h": float(jct.mean()) if jct.size else 0.0,
            "p99_jct_h": float(np.percentile(jct, 99)) if jct.size else 0.0,
            "makespan_h": float(max(ends) - min(j.submit_time for j in result.jobs)) / 3600
            if ends else 0.0,
            "finished": len(jct), "jobs": len(result.jobs),
            "moves_per_job": float(np.mean([j.restarts for j in result.jobs]))})
    out: dict[str, Any] = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
    out.update(finished=min(r["finished"] for r in runs), jobs=len(jobs),
               move_cost_s=move_cost, phases=phases,
               avg_jct_h_range=[min(r["avg_jct_h"] for r in runs),
                                max(r["avg_jct_h"] for r in runs)])
    return out
