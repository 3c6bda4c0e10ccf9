"""`sia demo` (what `make demo` runs until the live control plane exists):
Sia rounds for the paper's heterogeneous 64-GPU cluster and a sample of jobs in
the Helios mix, printed as readable tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO, cast

import numpy as np

from sia_grpc.bench.scenarios import run_rounds, sample_jobs
from sia_grpc.policy.cluster import Cluster, paper_hetero_cluster
from sia_grpc.policy.sia import SiaPolicy
from sia_grpc.policy.types import RoundResult

if TYPE_CHECKING:  # (imported when the live demo runs: the offline one needs none of them)
    from sia_grpc.api import pb
    from sia_grpc.client.sdk import AsyncJobHandle, AsyncSiaClient
    from sia_grpc.clock import Clock

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


# ---------------------------------------------------------------- the live demo

# A small trace in the Helios mix: (minute of arrival, application, adaptivity).
LIVE_TRACE = (
    (0, "cifar10", "adaptive"), (1, "ncf", "adaptive"), (3, "bert", "adaptive"),
    (5, "cifar10", "adaptive"), (6, "deepspeech2", "adaptive"), (8, "ncf", "adaptive"),
    (10, "cifar10", "rigid"), (12, "cifar10", "adaptive"), (15, "bert", "strong-scaling"),
    (18, "ncf", "adaptive"),
)
LIVE_CLUSTER = {"rtx": (1, 8), "aws": (2, 4), "dgx-ext": (1, 8)}


def live_spec(k: int, app: str, kind: str):
    """The spec of the trace's k-th job (LIVE_TRACE: application, adaptivity)."""
    from sia_grpc.api import pb

    spec = pb.JobSpec(name=f"{app}-{k}", application=app)
    if kind == "rigid":
        spec.adaptivity, spec.num_gpus, spec.batch_size = pb.ADAPTIVITY_RIGID, 4, 512
    elif kind == "strong-scaling":
        spec.adaptivity, spec.batch_size = pb.ADAPTIVITY_STRONG_SCALING, 128
    else:
        spec.adaptivity = pb.ADAPTIVITY_ADAPTIVE
    return spec


async def live_demo(rate: float = 120.0, refresh: float = 2.0, out: TextIO | None = None,
                    dashboard: str | None = None) -> int:
    """A controller and modeled agents of three GPU types on loopback; the trace
    submitted through the SDK at its arrival times; the allocation table as it
    changes; a JCT summary at the end. `dashboard`: where to serve `sia dashboard`
    meanwhile (HOST:PORT)."""
    import contextlib
    import sys

    from sia_grpc.api.present import cluster_report
    from sia_grpc.client import AsyncSiaClient
    from sia_grpc.controller.config import ControllerConfig
    from sia_grpc.dashboard.server import beside
    from sia_grpc.testing.localcluster import LocalCluster

    out = out or sys.stdout
    config = ControllerConfig(listen="127.0.0.1:0", db_path=":memory:")
    gpus = sum(n * g for n, g in LIVE_CLUSTER.values())
    print(f"Starting a controller and {sum(n for n, _ in LIVE_CLUSTER.values())} modeled node "
          f"agents ({', '.join(f'{n}×{g} {t}' for t, (n, g) in LIVE_CLUSTER.items())}: "
          f"{gpus} GPUs) on loopback, running {rate:g}× faster than real time.\n"
          "The agents emulate GPUs: each job's speed comes from the Sia artifact's measured "
          "profiles.", file=out)
    async with LocalCluster(LIVE_CLUSTER, rate=rate, config=config) as lc, \
            AsyncSiaClient(lc.target) as client, contextlib.AsyncExitStack() as stack:
        await lc.wait_registered(sum(n for n, _ in LIVE_CLUSTER.values()))
        assert lc.controller is not None
        clock = lc.controller.clock
        url = await stack.enter_async_context(beside(client, dashboard, out, clock=clock.time))
        handles = await _run_trace(client, clock, url, out, refresh)
        finals = [await h.job() for h in handles]
        print("\n" + cluster_report(await client.cluster(), await client.rounds(limit=5)),
              file=out)
    return _summary(cast("list[pb.Job]", finals), out)  # (JobViews: each reads as its pb.Job)


async def _run_trace(client: AsyncSiaClient, clock: Clock, url: str | None, out: TextIO,
                     refresh: float) -> list[AsyncJobHandle]:
    """Submit LIVE_TRACE at its arrival times (from now), and redraw the jobs table every
    `refresh` seconds until every job has ended; their handles."""
    import asyncio

    from sia_grpc.api import pb
    from sia_grpc.api.present import jobs_table

    tty = out.isatty()
    t0 = clock.time()
    handles = []

    async def submit_all() -> None:
        for k, (minute, app, kind) in enumerate(LIVE_TRACE):
            delay = t0 + minute * 60 - clock.time()
            if delay > 0:
                await clock.sleep(delay)
            handles.append(await client.submit(live_spec(k, app, kind)))

    submitter = asyncio.create_task(submit_all())
    while True:
        await asyncio.sleep(refresh)
        # (JobViews: each reads as the pb.Job it wraps)
        jobs = cast(list[pb.Job], [j async for j in client.list()])
        elapsed = (clock.time() - t0) / 60
        text = (f"cluster time {elapsed:5.1f} min — {len(jobs)}/{len(LIVE_TRACE)} jobs "
                f"submitted{f' — dashboard {url}' if url else ''}\n"
                f"{jobs_table(jobs, now=clock.time())}")
        print(("\x1b[2J\x1b[H" if tty else "\n") + text, file=out, flush=True)
        if submitter.done() and all(j.status.state in (pb.JOB_STATE_SUCCEEDED,
                                                      pb.JOB_STATE_FAILED,
                                                      pb.JOB_STATE_CANCELLED)
                                    for j in jobs):
            break
    await submitter
    return handles


def _summary(finals: list[pb.Job], out: TextIO) -> int:
    """Each job's state, JCT (cluster hours) and restarts, and the average JCT; 0 if
    every job succeeded."""
    from sia_grpc import api

    rows = []
    for j in finals:
        jct = (j.status.finish_time.ToNanoseconds() - j.status.create_time.ToNanoseconds()) / 3.6e12
        rows.append((j.spec.name, api.state_name(j.status.state),
                     f"{jct:.2f}", j.status.restarts))
    print("\nSummary (cluster time)", file=out)
    print(f"{'job':16s} {'state':10s} {'JCT h':>6s} {'restarts':>8s}", file=out)
    for name, state, hours, restarts in rows:
        print(f"{name:16s} {state:10s} {hours:>6s} {restarts:>8d}", file=out)
    done = [float(r[2]) for r in rows if r[1] == "SUCCEEDED"]
    print(f"average JCT {sum(done) / max(len(done), 1):.2f} h over {len(done)} jobs", file=out)
    return 0 if len(done) == len(rows) else 1
