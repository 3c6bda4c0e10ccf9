"""`sia bench policy`: how long one Sia round takes, production path beside the
paper's reference path (CVXPY + GLPK_MI), on the paper's heterogeneous cluster
scaled up, with the same inputs for both in the same run."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from sia_grpc.bench.scenarios import run_rounds, sample_jobs
from sia_grpc.policy.cluster import paper_hetero_cluster
from sia_grpc.policy.sia import SiaConfig, SiaPolicy

# Scale of the 64-GPU cluster → active jobs (the paper's Helios load is about
# 20–50 active jobs per 64 GPUs; the larger points are the targets).
DEFAULT_SCALES = {1: 40, 8: 320, 32: 2000, 128: 5000}


@dataclass
class ScaleResult:
    scale: int
    gpus: int
    jobs: int
    rounds: int
    call: dict[str, float] = field(default_factory=dict)  # production whole call
    solve: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # median per phase
    ref_call: dict[str, float] = field(default_factory=dict)
    ref_solve: dict[str, float] = field(default_factory=dict)
    ref_rounds: int = 0  # rounds the reference ran
    ref_timeouts: int = 0  # of which stopped at the time limit (their time is a lower bound)
    ref_note: str = ""
    max_rel_diff: float | None = None  # objective, production vs reference (optimal solves)
    ratio: float | None = None  # reference / production, median whole call
    ratio_p95: float | None = None  # the same for p95 (same rounds)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": float(np.median(xs)), "p95": float(np.percentile(xs, 95))} if xs else {}


def bench_scale(scale: int, num_jobs: int, rounds: int, warmup: int, ref_limit: float,
                with_reference: bool, seed: int = 0, progress=None) -> ScaleResult:
    """Production and reference on the same sequence of rounds. The reference
    stops at the first solve that reaches `ref_limit` (that solve is counted at
    the limit, a lower bound on its time)."""
    cluster = paper_hetero_cluster(scale)
    rng = np.random.default_rng(seed)
    jobs = sample_jobs(rng, num_jobs, cluster)
    prod = SiaPolicy()
    ref = SiaPolicy(SiaConfig(solver="glpk_mi", solver_time_limit=ref_limit))
    out = ScaleResult(scale, cluster.total_gpus, num_jobs, rounds)
    calls, solves, ref_calls, ref_solves, diffs = [], [], [], [], []
    phases: dict[str, list[float]] = {}
    ref_on = with_reference
    if not with_reference:
        out.ref_note = "not run (--no-reference)"
    for k, step in enumerate(run_rounds(prod, cluster, jobs, warmup + rounds)):
        if k < warmup:
            continue
        # The call as the scheduler made it: estimate caches warm only for jobs
        # whose candidate set is unchanged since the last round.
        res = step.result
        calls.append(step.seconds)
        solves.append(res.timings["solve"])
        for name, v in res.timings.items():
            phases.setdefault(name, []).append(v)
        if ref_on:
            # Same inputs; the reference's estimate phase finds warm caches.
            t0 = time.perf_counter()
            rres = ref.optimize(cluster, step.jobs, step.previous)
            ref_calls.append(time.perf_counter() - t0)
            ref_solves.append(rres.timings["solve"])
            if rres.timings["solve"] >= ref_limit * 0.99:
                out.ref_timeouts += 1
                ref_on = False
                out.ref_note = (f"GLPK_MI reached the {ref_limit:.0f} s limit in round "
                                f"{k - warmup + 1}; later rounds not run")
            else:
                diffs.append(abs(rres.objective - res.objective) / max(1.0, abs(rres.objective)))
        if progress:
            progress(scale, k - warmup + 1, rounds)
    out.call, out.solve = _stats(calls), _stats(solves)
    out.phases = {k: float(np.median(v)) for k, v in phases.items()}
    out.ref_call, out.ref_solve = _stats(ref_calls), _stats(ref_solves)
    out.ref_rounds = len(ref_calls)
    if diffs:
        out.max_rel_diff = float(max(diffs))
    if ref_calls:
        same = calls[:len(ref_calls)]
        out.ratio = float(np.median(ref_calls) / np.median(same))
        out.ratio_p95 = float(np.percentile(ref_calls, 95) / np.percentile(same, 95))
    return out


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.platform(terse=True)}")


def _ratio(r: ScaleResult, value: float | None) -> str:
    if value is None:
        return "—"
    return ("≥ " if r.ref_timeouts else "") + f"{value:,.1f}x"


def format_table(results: list[ScaleResult]) -> str:
    def ms(d: dict[str, float], key: str) -> str:
        return f"{d[key] * 1e3:,.1f}" if d else "—"

    head = ("| GPUs | jobs | call p50 ms | call p95 ms | solve p50 | solve p95 | "
            "ref call p50 | ref call p95 | ref solve p50 | ref solve p95 | ratio p50 | "
            "ratio p95 | obj diff |")
    lines = [head, "|" + "---|" * 13]
    for r in results:
        lines.append(
            f"| {r.gpus:,} | {r.jobs:,} | {ms(r.call, 'median')} | {ms(r.call, 'p95')} | "
            f"{ms(r.solve, 'median')} | {ms(r.solve, 'p95')} | {ms(r.ref_call, 'median')} | "
            f"{ms(r.ref_call, 'p95')} | {ms(r.ref_solve, 'median')} | {ms(r.ref_solve, 'p95')} | "
            f"{_ratio(r, r.ratio)} | {_ratio(r, r.ratio_p95)} | "
            f"{f'{r.max_rel_diff:.1e}' if r.max_rel_diff is not None else '—'} |")
    notes = [f"- {r.gpus:,} GPUs: reference ran {r.ref_rounds} of {r.rounds} rounds"
             + (f"; {r.ref_note}" if r.ref_note else "") for r in results
             if r.ref_rounds < r.rounds or r.ref_note]
    phase = ["", "Median time per phase of the production call (ms):", "",
             "| GPUs | estimate | build | solve | place |", "|---|---|---|---|---|"]
    for r in results:
        phase.append(f"| {r.gpus:,} | " + " | ".join(
            f"{r.phases.get(k, 0) * 1e3:,.1f}" for k in ("estimate", "build", "solve", "place"))
            + " |")
    return "\n".join(lines + ([""] + notes if notes else []) + phase)


def format_queues(q: dict) -> str:
    """`solver_rows.run_policy`'s result as a table: the call with queues beside the
    same rounds without."""
    def ms(d: dict, key: str) -> str:
        return f"{d[key] * 1e3:,.1f}"

    budget = q.get("restart_budget")
    restarts = "no restart budget" if budget is None else f"at most {budget} restarts a round"
    return "\n".join([
        f"Whole policy call with {q['num_queues']} queues ({restarts}), {q['gpus']:,} GPUs, "
        f"{q['jobs']:,} jobs, {q['rounds']} rounds (the same rounds without queues beside):", "",
        "| | call p50 ms | call p95 ms | solve p50 ms | solve p95 ms |", "|---|---|---|---|---|",
        f"| no queues | {ms(q['plain'], 'p50')} | {ms(q['plain'], 'p95')} | "
        f"{ms(q['plain_solve'], 'p50')} | {ms(q['plain_solve'], 'p95')} |",
        f"| {q['num_queues']} queues | {ms(q['queues'], 'p50')} | {ms(q['queues'], 'p95')} | "
        f"{ms(q['queues_solve'], 'p50')} | {ms(q['queues_solve'], 'p95')} |", "",
        f"call p95 ratio (queues / none): {q['ratio_p95']:.2f}x; silos solved a round "
        f"{q['silos_solved']['p50']:g} (median, at most {q['silos_solved']['max']:g}), "
        f"shared solves {q['passes']['p50']:g} (at most {q['passes']['max']:g})"])


def run(argv_scales: list[int], rounds: int, warmup: int, ref_limit: float,
        with_reference: bool, json_out: str | None, queues: int = 0) -> int:
    results = []
    for scale in argv_scales:
        n = DEFAULT_SCALES.get(scale, 40 * scale)

        def tick(s: int, k: int, total: int) -> None:
            print(f"\r  scale x{s}: round {k}/{total}", end="", file=sys.stderr, flush=True)

        print(f"scale x{scale}: {64 * scale:,} GPUs, {n:,} jobs", file=sys.stderr)
        results.append(bench_scale(scale, n, rounds, warmup, ref_limit, with_reference,
                                   progress=tick))
        print(file=sys.stderr)
    with_queues = no_budget = None
    if queues:
        from sia_grpc.bench.solver_rows import run_policy

        print(f"{queues} queues: 2,048 GPUs, 2,000 jobs, {rounds} rounds", file=sys.stderr)
        with_queues = run_policy(rounds, num_queues=queues, warmup=max(warmup, 1))
        # The same queues without the restart budget: in the rounds where the budget
        # binds, its hard row couples every job, and the call without queues has no
        # such row to compare with (docs/benchmarks.md), so both are shown.
        print(f"{queues} queues without a restart budget", file=sys.stderr)
        no_budget = run_policy(rounds, num_queues=queues, warmup=max(warmup, 1),
                               restart_share=None)
    print(f"sia bench policy — {machine()}\n")
    print(format_table(results))
    if with_queues:
        assert no_budget is not None  # (run with it)
        print("\n" + format_queues(with_queues))
        print("\n" + format_queues(no_budget))
    if json_out:
        payload = {"machine": machine(), "results": [r.__dict__ for r in results],
                   "queues": with_queues, "queues_no_budget": no_budget}
        with open(json_out, "w") as f:
            json.dump(payload, f, indent=2)
    return 0
