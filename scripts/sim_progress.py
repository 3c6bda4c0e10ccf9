"""One `sia simulate` run that says how far it has got while it runs.

    .venv/bin/python scripts/sim_progress.py WORKLOAD POLICY [--scale K] [--every S]
        [--json OUT]

The same simulation as `sia simulate WORKLOAD --policy POLICY --scale K --jobs 1`
(`sim.runner.run_one`'s policy, trace, cluster and engine; the shipped settings), for
runs that may not finish in the time one has (the scalability study's largest in
docs/results.md): every `--every` wall seconds it prints to stderr the rounds done,
the simulated time, the jobs that have arrived and finished, and the policy's wall
time per round so far, so a run stopped early (`timeout`) still says its rate. When
it finishes, `--json` gets what `sia simulate --json` writes for the run (a list of one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from sia_grpc.policy import make_policy
from sia_grpc.policy import params as policy_params
from sia_grpc.sim import metrics
from sia_grpc.sim.clusters import load_cluster
from sia_grpc.sim.engine import SimConfig, simulate
from sia_grpc.sim.runner import load_trace


class _Watched:
    """The policy, its `optimize` timed and its progress printed now and then."""

    def __init__(self, policy, total_jobs: int, every_s: float) -> None:
        self._policy, self._total, self._every = policy, total_jobs, every_s
        self.name, self.round_duration = policy.name, policy.round_duration
        self._t0 = self._last = time.perf_counter()
        self._ms: list[float] = []
        self._seen: set[str] = set()

    def optimize(self, cluster, jobs, previous, **kw):
        t = time.perf_counter()
        result = self._policy.optimize(cluster, jobs, previous, **kw)
        self._ms.append((time.perf_counter() - t) * 1e3)
        self._seen.update(j.job_id for j in jobs)
        if time.perf_counter() - self._last >= self._every:
            self._last = time.perf_counter()
            self.report(jobs)
        return result

    def report(self, jobs) -> None:
        now_h = max((j.submit_time + j.age for j in jobs), default=0.0) / 3600.0
        done = len(self._seen) - len(jobs)
        ms = np.asarray(self._ms)
        print(f"[{time.perf_counter() - self._t0:7.0f} s wall] {len(ms)} rounds, "
              f"sim {now_h:.2f} h, arrived {len(self._seen)}/{self._total}, "
              f"finished {done}/{self._total}, active {len(jobs)}, policy ms "
              f"p50 {np.median(ms):.0f} p95 {np.percentile(ms, 95):.0f}",
              file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("policy")
    ap.add_argument("--cluster", default="hetero64")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between reports")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    policy = make_policy(args.policy, {})
    trace, _ = load_trace(args.workload, None)
    watched = _Watched(policy, len(trace), args.every)
    result = simulate(trace, load_cluster(args.cluster, scale=args.scale), watched,
                      workload_name=args.workload,
                      cluster_name=f"{args.cluster}x{args.scale}", config=SimConfig())
    result = dataclasses.replace(result, policy=args.policy, params={},
                                 settings=policy_params.current(policy))
    m = metrics.compute(result)
    print(f"done: {len(result.rounds)} rounds, {result.cpu_seconds:.0f} CPU-s, "
          f"{result.wall_seconds:.0f} wall s; {m}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([metrics.to_json(result, m)], indent=2,
                                              default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
