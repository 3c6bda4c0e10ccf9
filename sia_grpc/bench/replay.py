"""`sia replay`: a trace submitted through the SDK, at its arrival times, to a
live controller with modeled agents — the control plane measured against the
simulator on the same workload (the paper reports < 5% between its simulator
and its physical cluster).

The cluster runs `rate`× faster than real time: controller clock, round timer,
heartbeats and modeled workers alike. Each job's JCT is its finish time minus its
creation time on the controller's clock.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sia_grpc.api import pb
from sia_grpc.client import AsyncSiaClient
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.emulation import load_app
from sia_grpc.policy.cluster import Cluster
from sia_grpc.sim.workload import Category, TraceJob
from sia_grpc.testing.localcluster import LocalCluster

_ADAPTIVITY = {Category.ADAPTIVE: pb.ADAPTIVITY_ADAPTIVE, Category.RIGID: pb.ADAPTIVITY_RIGID,
               Category.STRONG_SCALING: pb.ADAPTIVITY_STRONG_SCALING}


def trace_spec(job: TraceJob) -> pb.JobSpec:
    """The job as a user would submit it (what the simulator gives its policies)."""
    spec = pb.JobSpec(name=job.name, application=job.application,
                      adaptivity=_ADAPTIVITY[job.category])
    if job.category is not Category.ADAPTIVE:
        spec.batch_size = job.batch_size
    if job.category is Category.RIGID:
        spec.num_gpus = job.num_replicas
    spec.max_batch_size = max(load_app(job.application).max_batch_size, job.batch_size)
    return spec


def cluster_nodes(cluster: Cluster) -> dict[str, tuple[int, int]]:
    """A policy `Cluster` as a LocalCluster spec (one GPU count per type)."""
    out: dict[str, tuple[int, int]] = {}
    for n in cluster.nodes:
        count, per = out.get(n.gpu_type, (0, n.num_gpus))
        if per != n.num_gpus:
            raise ValueError(f"cluster: type {n.gpu_type!r} mixes node sizes")
        out[n.gpu_type] = (count + 1, per)
    return out


@dataclass
class ReplayResult:
    jct: dict[str, float]  # job name -> seconds
    wait: dict[str, float]  # job name -> seconds from creation to first start
    states: dict[str, str]
    restarts: dict[str, int]
    wall_seconds: float
    rounds: int
    round_ms: list[float] = field(default_factory=list)
    # trigger ("timer", "arrival", ...) -> [rounds, jobs moved]
    triggers: dict[str, list[int]] = field(default_factory=dict)

    @property
    def avg_jct_h(self) -> float:
        return float(np.mean(list(self.jct.values()))) / 3600 if self.jct else float("nan")


async def replay(jobs: Sequence[TraceJob], cluster: Cluster, *, rate: float,
                 policy: str = "sia", config: ControllerConfig | None = None,
                 telemetry_interval: float | None = None,
                 progress: Callable[[int, int, float], None] | None = None) -> ReplayResult:
    """Submit `jobs` at their trace times and wait for every one to end."""
    cfg = replace(config or ControllerConfig(), listen="127.0.0.1:0", db_path=":memory:",
                  policy=policy)
    wall0 = time.monotonic()
    async with LocalCluster(cluster_nodes(cluster), rate=rate, config=cfg,
                            telemetry_interval=telemetry_interval) as lc, \
            AsyncSiaClient(lc.target, timeout=60.0) as client:
        await lc.wait_registered(len(cluster.nodes))
        assert lc.controller is not None
        clock = lc.controller.clock
        t0 = clock.time()
        handles = {}
        order = sorted(jobs, key=lambda j: (j.time, j.name))
        waiter = asyncio.create_task(_report(lc, len(order), progress))
        for job in order:
            delay = t0 + job.time - clock.time()
            if delay > 0:
                await clock.sleep(delay)
            handles[job.name] = await client.submit(trace_spec(job))
        finals = await asyncio.gather(*(h.wait() for h in handles.values()))
        waiter.cancel()
        rounds = list(lc.controller.rounds)
    triggers: dict[str, list[int]] = {}
    for r in rounds:
        count = triggers.setdefault(r.trigger or "timer", [0, 0])
        count[0] += 1
        count[1] += r.jobs_moved
    jct, wait, states, restarts = {}, {}, {}, {}
    for name, final in zip(handles, finals, strict=True):
        states[name] = pb.JobState.Name(final.status.state)
        restarts[name] = final.status.restarts
        created = final.status.create_time.ToNanoseconds()
        if final.status.HasField("start_time"):
            wait[name] = (final.status.start_time.ToNanoseconds() - created) / 1e9
        if final.status.state == pb.JOB_STATE_SUCCEEDED:
            jct[name] = (final.status.finish_time.ToNanoseconds() - created) / 1e9
    return ReplayResult(jct=jct, wait=wait, states=states, restarts=restarts,
                        wall_seconds=time.monotonic() - wall0, rounds=rounds[-1].round
                        if rounds else 0, round_ms=[r.total_ms for r in rounds], triggers=triggers)


async def _report(lc: LocalCluster, total: int,
                  progress: Callable[[int, int, float], None] | None) -> None:
    if progress is None:
        return
    while True:
        await asyncio.sleep(1.0)
        assert lc.controller is not None
        states = lc.controller.state.jobs_by_state()
        done = sum(states.get(s, 0) for s in ("SUCCEEDED", "FAILED", "CANCELLED"))
        progress(done, total, (lc.controller.clock.time() - lc.controller.state.started_at))


def print_progress(done: int, total: int, elapsed: float) -> None:
    print(f"\r  {done}/{total} jobs done, {elapsed / 3600:5.2f} h of cluster time",
          end="", file=sys.stderr, flush=True)


def run(workload: str, *, rate: float, policy: str = "sia", cluster: str = "hetero64",
        first: int | None = None, compare: bool = True, json_out: str | None = None,
        reuse_profiles: bool = True) -> int:
    """`sia replay`: replay live, simulate the same jobs, print both."""
    import json

    from sia_grpc.observability import configure_logging
    from sia_grpc.sim.clusters import load_cluster
    from sia_grpc.sim.workload import load_workload

    configure_logging(level="error")  # (the embedded services: the replay prints its own story)
    jobs = sorted(load_workload(workload), key=lambda j: (j.time, j.name))
    if first is not None:
        jobs = jobs[:first]
    topology = load_cluster(cluster)
    horizon = max(j.time for j in jobs) / 3600
    print(f"replaying {len(jobs)} jobs of {workload} (arrivals over {horizon:.1f} h) on "
          f"{cluster} ({topology.total_gpus} GPUs) at {rate:g}× real time", file=sys.stderr)
    live = asyncio.run(replay(jobs, topology, rate=rate, policy=policy,
                              config=ControllerConfig(reuse_profiles=reuse_profiles),
                              progress=print_progress))
    print(file=sys.stderr)
    report: dict[str, Any] = {
        "workload": workload, "jobs": len(jobs), "rate": rate, "policy": policy,
        "reuse_profiles": reuse_profiles, "live": _live_summary(live)}
    if compare:
        report["simulated"] = _simulated_summary(jobs, topology, policy, workload)
        report["difference"] = live.avg_jct_h / report["simulated"]["avg_jct_h"] - 1
    failed = [n for n, s in live.states.items() if s != "JOB_STATE_SUCCEEDED"]
    _print_summary(report, live, succeeded=len(jobs) - len(failed))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if not failed else 1


def _live_summary(live: ReplayResult) -> dict[str, Any]:
    """The live replay's part of the report."""
    return {"avg_jct_h": live.avg_jct_h, "wall_s": live.wall_seconds,
            "avg_wait_s": float(np.mean(list(live.wait.values()))),
            "rounds": live.rounds, "states": live.states,
            "rounds_by_trigger": live.triggers,
            "restarts_per_job": float(np.mean(list(live.restarts.values()))),
            "round_ms_p50": float(np.median(live.round_ms)) if live.round_ms else None,
            "round_ms_p95": float(np.percentile(live.round_ms, 95)) if live.round_ms else None}


def _simulated_summary(jobs: Sequence[TraceJob], topology: Cluster, policy: str,
                       workload: str) -> dict[str, Any]:
    """The same jobs in the simulator, summarised as the live replay is."""
    from sia_grpc.policy import make_policy
    from sia_grpc.sim.engine import simulate

    sim = simulate(jobs, topology, make_policy(policy), workload_name=workload)
    jcts = [j.finish_time - j.submit_time for j in sim.jobs if j.finish_time is not None]
    return {"avg_jct_h": float(np.mean(jcts)) / 3600,
            "avg_wait_s": float(np.mean([(j.start_time or j.submit_time) - j.submit_time
                                         for j in sim.jobs])),
            "restarts_per_job": float(np.mean([j.restarts for j in sim.jobs]))}


def _print_summary(report: dict[str, Any], live: ReplayResult, *, succeeded: int) -> None:
    """The report as a table: live (and simulated) side by side."""
    print(f"{'':10s} avg JCT h  restarts/job  wait to start s")
    for name in ("live", "simulated") if "simulated" in report else ("live",):
        r = report[name]
        print(f"{name:10s} {r['avg_jct_h']:9.3f}  {r['restarts_per_job']:12.2f}  "
              f"{r['avg_wait_s']:15.0f}")
    if "simulated" in report:
        print(f"live vs simulated: {report['difference'] * 100:+.1f}%")
    print(f"{succeeded}/{report['jobs']} jobs succeeded; {live.rounds} rounds in "
          f"{live.wall_seconds:.0f} s of wall time")
    print("rounds (jobs moved) by trigger: " + ", ".join(
        f"{t} {n} ({m})" for t, (n, m) in sorted(live.triggers.items())))
