"""The end of every policy's round: place the chosen configurations on physical GPUs
(`finish_round`) and explain each job's outcome (`outcomes`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from sia_grpc.policy.candidates import CandidateTable
from sia_grpc.policy.cluster import Config, GpuId
from sia_grpc.policy.placer import place
from sia_grpc.policy.types import JobAllocation, PolicyJob, RoundResult


def finish_round(table: CandidateTable, jobs: Sequence[PolicyJob], chosen: Mapping[str, int],
                 previous: Mapping[str, JobAllocation], *, objective: float,
                 timings: dict[str, float],
                 solver_stats: Mapping[str, float] | None = None,
                 placed: Mapping[str, tuple[Config, tuple[GpuId, ...]]] | None = None,
                 pinned: frozenset[str] = frozenset(),
                 ) -> RoundResult:
    """Place the chosen rows (job id → row of `table`) and assemble the result.

    `placed` (job id → its shape and GPUs) replaces Sia's placer for a policy
    that places jobs its own way (Gavel). `pinned` jobs are moved to make room
    only where nothing else does (`placer.place`)."""
    t0 = time.perf_counter()
    names, rows = list(chosen), np.fromiter(chosen.values(), dtype=np.int64, count=len(chosen))
    if placed is None:
        all_configs = table.cluster.configs
        configs = [all_configs[k] for k in table.config[rows].tolist()]
        gpus = place(table.cluster, dict(zip(names, configs, strict=True)),
                     {j: a.gpus for j, a in previous.items() if a.gpus}, pinned).placements
    else:
        configs = [placed[j][0] for j in names]
        gpus = {j: g for j, (_, g) in placed.items()}
    # Whole columns to Python numbers at once: one numpy scalar per job and field
    # cost more than the placer at 20,000 jobs.
    columns = zip(names, configs, table.replicas[rows].tolist(),
                  table.batch_size[rows].tolist(), table.atomic_bsz[rows].tolist(),
                  table.accum_steps[rows].tolist(), table.goodput[rows].tolist(), strict=True)
    make = JobAllocation.of
    allocations = {j: make(config, gpus[j], reps, bsz, atomic, accum, goodput)
                   for j, config, reps, bsz, atomic, accum, goodput in columns}
    reasons, restarted = outcomes(table, jobs, allocations, previous)
    # ("place": the placement and the result assembled from it, reasons included)
    timings["place"] = time.perf_counter() - t0
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    return RoundResult(allocations=allocations, restarted=restarted, objective=objective,
                       timings=dict(timings), solver_stats=dict(solver_stats or {}),
                       reasons=reasons)


def outcomes(table: CandidateTable, jobs: Sequence[PolicyJob],
             allocations: Mapping[str, JobAllocation],
             previous: Mapping[str, JobAllocation]) -> tuple[dict[str, str], frozenset[str]]:
    """A human-readable reason for each job's outcome this round, and the jobs it
    restarts (in one pass: at 20,000 jobs each pass's lookups are most of its cost).

    The verb says what happens to the job's GPUs (started, kept, scaled 2→4, moved
    to another type or other GPUs, repacked onto fewer nodes); a change names the
    goodput it expects against staying where it is, both estimated now (the goodput
    stored with the old allocation came from an older estimate).

    An active job restarts when it held GPUs and now holds different ones (or none);
    `previous` may still list jobs that have finished since (not in `jobs`)."""
    reasons: dict[str, str] = {}
    restarted: list[str] = []
    for i, job in enumerate(jobs):
        prev, now = previous.get(job.job_id), allocations.get(job.job_id)
        if prev is not None and prev.gpus and (now is None or now.gpus != tuple(prev.gpus)):
            restarted.append(job.job_id)
        if now is None:
            if table.count(i) == 0:
                reasons[job.job_id] = "waiting: no allowed GPU type can run it (no estimate)"
            elif prev is not None:
                reasons[job.job_id] = "preempted: its GPUs are worth more to other jobs"
            else:
                reasons[job.job_id] = "waiting: no GPUs free for it this round"
            continue
        n, t = now.config.num_gpus, now.config.gpu_type
        batch = f"batch {now.batch_size}"
        if prev is None:
            reasons[job.job_id] = f"started on {n} {t}, {batch}"
            continue
        if prev.gpus == now.gpus or sorted(prev.gpus) == sorted(now.gpus):
            if prev.batch_size != now.batch_size:
                batch = f"batch {prev.batch_size}→{now.batch_size}"
            reasons[job.job_id] = f"kept {n} {t}, {batch}"
            continue
        pn, pt = prev.config.num_gpus, prev.config.gpu_type
        if pt != t:
            what = f"moved {pn} {pt}→{n} {t}"
        elif pn != n:
            what = f"scaled {pn}→{n} {t}"
        elif prev.config == now.config:
            what = f"moved to other {n} {t}"
        else:
            nodes = now.config.num_nodes
            what = f"repacked {n} {t} onto {nodes} node{'s' if nodes > 1 else ''}"
        reasons[job.job_id] = f"{what}, {batch}{_gain(table, i, prev, now)}"
    return reasons, frozenset(restarted)


def _gain(table: CandidateTable, i: int, prev: JobAllocation, now: JobAllocation) -> str:
    """": goodput +35%" against keeping `prev`'s shape, both as estimated this round."""
    for row in range(int(table.offsets[i]), int(table.offsets[i + 1])):
        if table.config_of(row) == prev.config:
            stay = float(table.goodput[row])
            change = (now.goodput / stay - 1) * 100 if stay > 0 else 0.0
            return f": goodput {change:+.0f}%" if abs(change) >= 0.5 else ""
    return ""
