"""`sia demo` (what `make demo` runs): real PyTorch training scheduled by Sia.

A controller and two node agents of different GPU types run on this machine.
The machine has no GPUs, so the agents EMULATE them: workers run on the CPU and
each step is stretched to the relative speed the artifact's profiles give the
type (docs/agent.md). Four small training jobs (the examples in
`sia_grpc.train.examples`) arrive over the first minute; each is profiled on
both types, then scaled, moved and resized by Sia's rounds through
checkpoint-restart, until it reaches its target. The live allocation table is
printed as it changes and a summary ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, cast

from sia_grpc.api import pb, state_name
from sia_grpc.api.present import cluster_report, format_gpus, jobs_table
from sia_grpc.client import AsyncSiaClient
from sia_grpc.client.sdk import is_terminal
from sia_grpc.controller.config import ControllerConfig
from sia_grpc.controller.shell.server import Controller
from sia_grpc.dashboard.server import beside
from sia_grpc.testing.localcluster import stop_agents

# (node name, GPU type, emulated GPUs): the paper's fastest and a mid-range type.
NODES = (("a100-0", "dgx-ext", 2), ("rtx-0", "rtx", 2))


@dataclass(frozen=True)
class DemoJob:
    arrival_s: float
    name: str
    example: str  # module under sia_grpc.train.examples
    epochs: float
    batch_size: int  # the initial global batch the gradient statistics refer to
    max_batch_size: int
    args: tuple[str, ...] = ()  # the example's size: 20-35 s alone on one fast emulated GPU


JOBS = (
    DemoJob(0, "mlp-a", "mlp", 20, 64, 4096, ("--hidden", "1024", "--samples", "131072")),
    DemoJob(5, "cnn-a", "cnn", 12, 32, 2048, ("--samples", "65536")),
    DemoJob(30, "mlp-b", "mlp", 12, 64, 4096, ("--hidden", "1024", "--samples", "131072")),
    DemoJob(50, "cnn-b", "cnn", 8, 32, 2048, ("--samples", "65536")),
)


def job_spec(job: DemoJob, gpu_types: list[str]) -> pb.JobSpec:
    """A real job as a user submits it: the command, and the batch limits the
    scheduler needs for an application it has no shipped profiles of."""
    command = [sys.executable, "-m", f"sia_grpc.train.examples.{job.example}",
               "--epochs", f"{job.epochs:g}", "--batch-size", str(job.batch_size), *job.args]
    spec = pb.JobSpec(name=job.name, application=job.example, command=command,
                      adaptivity=pb.ADAPTIVITY_ADAPTIVE, max_gpus=4,
                      batch_size=job.batch_size, max_batch_size=job.max_batch_size,
                      epochs=job.epochs, restart_cost_s=5.0)
    for t in gpu_types:
        spec.type_batch_limits.add(gpu_type=t, min_local_batch_size=8,
                                   max_local_batch_size=job.max_batch_size // 2)
    return spec


def _spawn_agent(target: str, node: str, gpu_type: str, gpus: int,
                 workdir: Path) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "agent.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "sia_grpc.nodeagent", "--controller", target, "--node-id",
             node, "--backend", "torch", "--emulate", f"{gpu_type}:{gpus}", "--workdir",
             str(workdir), "--stop-grace", "20", "--telemetry-interval", "1",
             # The strongest isolation this machine allows (`none` for a user
             # without root); the agent logs which, and `sia cluster` shows it.
             "--isolation", "auto", "--log-format", "json"],
            stdout=log, stderr=subprocess.STDOUT)


async def train_demo(*, jobs: Sequence[DemoJob] = JOBS, round_s: float = 10.0,
                     refresh_s: float = 2.0, limit_s: float = 900.0,
                     out: TextIO | None = None, keep: str | None = None,
                     dashboard: str | None = None) -> int:
    """The demo; `dashboard`: where to serve `sia dashboard` meanwhile (HOST:PORT)."""
    out = out or sys.stdout
    tty = out.isatty()
    with contextlib.ExitStack() as stack:
        root = Path(keep) if keep else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="sia-demo-")))
        root.mkdir(parents=True, exist_ok=True)
        # The jobs' users pass through to their own folders (agents' run folders,
        # checkpoints); they list nothing here.
        os.chmod(root, 0o711)
        config = ControllerConfig(
            listen="127.0.0.1:0", db_path=str(root / "controller.db"), round_duration=round_s,
            early_round_delay=1.0, heartbeat_interval=1.0, heartbeat_timeout=15.0,
            checkpoint_root=str(root / "checkpoints"))
        print(f"sia demo: a controller and {len(NODES)} node agents on loopback; work files "
              f"in {root}.\nThis machine has no GPUs: the agents EMULATE "
              + " and ".join(f"{n} {t}" for _, t, n in NODES)
              + " GPUs with CPU workers paced to each type's measured speed.\n"
              f"Rounds every {round_s:g} s; {len(jobs)} real PyTorch jobs arrive over "
              f"{max(j.arrival_s for j in jobs):.0f} s.", file=out, flush=True)
        controller = Controller(config)
        await controller.start()
        agents: list[subprocess.Popen] = []
        try:
            target = f"127.0.0.1:{controller.port}"
            agents = [_spawn_agent(target, n, t, k, root / n) for n, t, k in NODES]
            async with asyncio.timeout(60):
                while len(controller.agents) < len(NODES):
                    await asyncio.sleep(0.1)
            async with AsyncSiaClient(target) as client, \
                    beside(client, dashboard, out) as url:
                levels = {n.name: n.isolation for n in (await client.cluster()).nodes}
                print("Node isolation (docs/security.md): " + ", ".join(
                    f"{n} {level or '?'}" for n, level in sorted(levels.items()))
                    + ("" if os.geteuid() == 0 else " (not root: jobs run as you)"),
                    file=out, flush=True)
                ok = await _run(client, jobs, [t for _, t, _ in NODES], out, tty, refresh_s,
                                limit_s, url)
                print("\n" + cluster_report(await client.cluster(), await client.rounds(limit=8)),
                      file=out)
            return 0 if ok else 1
        finally:
            await stop_agents(agents)
            await controller.close(grace=1.0)


async def _run(client: AsyncSiaClient, demo_jobs: Sequence[DemoJob], gpu_types: list[str],
               out: TextIO, tty: bool, refresh_s: float, limit_s: float, url: str) -> bool:
    t0 = time.monotonic()
    handles = []

    async def submit_all() -> None:
        for job in demo_jobs:
            delay = t0 + job.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            handles.append(await client.submit(job_spec(job, gpu_types)))

    submitter = asyncio.create_task(submit_all())
    jobs: list[pb.Job] = []
    seen: dict[str, list[str]] = {}  # job name -> the allocations it ran on, in order
    try:
        while time.monotonic() - t0 < limit_s:
            await asyncio.sleep(refresh_s)
            # (JobViews: each reads as the pb.Job it wraps)
            jobs = cast(list[pb.Job], [j async for j in client.list()])
            for j in jobs:
                if j.status.state == pb.JOB_STATE_RUNNING:
                    path = seen.setdefault(j.spec.name, [])
                    here = format_gpus(j)
                    if not path or path[-1] != here:
                        path.append(here)
            text = (f"{time.monotonic() - t0:5.0f} s — {len(jobs)}/{len(demo_jobs)} jobs "
                    f"submitted{f' — dashboard {url}' if url else ''}\n"
                    + jobs_table(jobs, now=time.time()))
            print(("\x1b[2J\x1b[H" if tty else "\n") + text, file=out, flush=True)
            if submitter.done() and len(jobs) == len(demo_jobs) and all(map(is_terminal, jobs)):
                break
        else:
            print(f"\nsia demo: not done after {limit_s:.0f} s; stopping", file=out)
    finally:
        submitter.cancel()
    print("\nSummary", file=out)
    print(f"{'job':8s} {'state':10s} {'JCT s':>6s} {'restarts':>8s}  ran on (as seen)",
          file=out)
    done = []
    for j in sorted(jobs, key=lambda j: j.spec.name):
        st = j.status
        jct = ((st.finish_time.ToNanoseconds() - st.create_time.ToNanoseconds()) / 1e9
               if st.HasField("finish_time") else float("nan"))
        if st.state == pb.JOB_STATE_SUCCEEDED:
            done.append(jct)
        where = " → ".join(seen.get(j.spec.name, ())) or "-"
        print(f"{j.spec.name:8s} {state_name(st.state):10s} "
              f"{jct:6.0f} {st.restarts:8d}  {where}", file=out)
    if done:
        print(f"average JCT {sum(done) / len(done):.0f} s over {len(done)} jobs", file=out)
    return len(done) == len(demo_jobs)


def main(keep: str | None = None, dashboard: str | None = None) -> int:
    from sia_grpc.controller.shell.server import loop_factory
    from sia_grpc.observability import configure_logging

    configure_logging(level="error")  # (the embedded services: the demo prints its own story)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(train_demo(keep=keep, dashboard=dashboard))
