"""The modeled worker of `sia bench slurm`: a Slurm job that "trains" without GPUs.

It runs as the job's command, `python -m sia_grpc.bench.slurm_worker APP ...`, and
follows the emulation's ground truth (`sia_grpc.emulation`, what the simulator and
the node agents' modeled workers run: `Trajectory.plan` over `AppTruth`): it pays
the application's restore delay, then advances at the progress rate of its shape,
until the application's `max_progress`. Modeled time runs `--time-scale` times
faster than the clock. Its shape is

- the bridge's (`SIA_GPU_TYPE`, `SIA_NUM_GPUS`, `SIA_NUM_NODES`,
  `SIA_ATOMIC_BATCH_SIZE`, `SIA_ACCUM_STEPS`: `sia-slurm env`), or
- with `--batch-size B --gpus N` (Slurm alone: the N GPUs it asked Slurm for, on
  one node), its node's type (`SLURMD_NODENAME`'s gres type, `--node-type
  NODE=GRES`), B split over the N GPUs as the policies split a fixed batch.

Modeled time starts when Slurm launched the job (the batch script `exec`s the
worker), so the seconds Python takes to start here count as the modeled restore
delay, not on top of it. Its progress is a JSON file (`--checkpoint`, or `progress.json` in
`SIA_CHECKPOINT_DIR`), written on SIGTERM (the bridge moving it) and read at start,
so a moved job resumes where it stopped. With `SIA_AGENT_ADDRESS`/`SIA_AGENT_TOKEN`
it reports its step times and gradient statistics to the bridge as
`sia_grpc.train`'s rank 0 does (a `WorkerReport` every `--report-every` seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sia_grpc.api import pb
    from sia_grpc.emulation import AppTruth
    from sia_grpc.nodeagent.modeled import Trajectory

__all__ = ["main"]

# SIGTERM (the bridge moving the job) may come while the imports below still run:
# it is noted from the first moment, and the checkpoint written once they are done.
_STOP = threading.Event()
_STOPPED_AT: list[float] = []  # time.monotonic() of the SIGTERM


def _on_sigterm(*_) -> None:
    _STOPPED_AT.append(time.monotonic())
    _STOP.set()


def _shape(args: argparse.Namespace, app: AppTruth) -> tuple[str, pb.Allocation]:
    """(profile GPU type, allocation) this run trains on."""
    from sia_grpc.api import pb
    from sia_grpc.models.goodput import split_local_batch
    from sia_grpc.nodeagent.gpus import gpu_type_for

    env = os.environ
    if args.batch_size is None:
        return env["SIA_GPU_TYPE"], pb.Allocation(
            num_nodes=int(env["SIA_NUM_NODES"]), num_replicas=int(env["SIA_NUM_GPUS"]),
            atomic_batch_size=int(env["SIA_ATOMIC_BATCH_SIZE"]),
            accum_steps=int(env.get("SIA_ACCUM_STEPS", "0")))
    types = dict(kv.split("=", 1) for kv in args.node_type)
    gpu_type = gpu_type_for(types[env["SLURMD_NODENAME"]])
    atomic, accum = split_local_batch(args.batch_size / args.gpus,
                                      app.local_bsz_limits(gpu_type)[1])
    return gpu_type, pb.Allocation(num_nodes=1, num_replicas=args.gpus,
                                   atomic_batch_size=int(atomic), accum_steps=int(accum))


def _process_age_s() -> float:
    """Seconds since this process started: since Slurm launched the batch script,
    which `exec`s the worker (same pid; /proc/self/stat's starttime)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # (field 22 of stat)
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def _report(client, app: AppTruth, gpu_type: str, alloc: pb.Allocation,
            path: Trajectory, progress: float, steps: int) -> None:
    from sia_grpc.api import pb

    batch = alloc.num_replicas * alloc.atomic_batch_size * (alloc.accum_steps + 1)
    grad = app.grad_params(progress, batch)
    t = pb.Telemetry(job_id=os.environ.get("SIA_JOB_ID", ""),
                     generation=int(os.environ.get("SIA_GENERATION", "0")),
                     progress=progress / app.max_progress,
                     grad=pb.GradientStats(sqr=grad.sqr, var=grad.var))
    t.samples.append(pb.ThroughputSample(
        gpu_type=gpu_type, num_nodes=alloc.num_nodes, num_replicas=alloc.num_replicas,
        atomic_batch_size=alloc.atomic_batch_size, accum_steps=alloc.accum_steps,
        step_time_s=path.step_time, sync_time_s=path.sync_time, count=max(steps, 1)))
    client.report(pb.WorkerReport(telemetry=t), force=True)


def run(args: argparse.Namespace) -> int:
    # Modeled time runs from the job's launch: the restart cost is the application's
    # modeled restore delay, which this machine's Python imports (seconds of the
    # clock, scaled into minutes of modeled time) hide under, as in either arm.
    started = time.monotonic() - _process_age_s()
    from sia_grpc.emulation import load_app
    from sia_grpc.nodeagent.modeled import Trajectory

    app = load_app(args.application)
    ckpt = Path(args.checkpoint or Path(os.environ["SIA_CHECKPOINT_DIR"]) / "progress.json")
    progress = json.loads(ckpt.read_text())["progress"] if ckpt.exists() else 0.0
    gpu_type, alloc = _shape(args, app)
    path = Trajectory.plan(app, gpu_type, alloc, progress)
    scale = args.time_scale
    stop = _STOP

    def trained_s() -> float:  # modeled seconds of training so far (after the restore)
        now = _STOPPED_AT[0] if _STOPPED_AT else time.monotonic()
        return max((now - started) * scale - app.restart_delay, 0.0)

    client = None
    if os.environ.get("SIA_AGENT_ADDRESS"):
        from sia_grpc.train.telemetry import AgentClient

        client = AgentClient(address=os.environ["SIA_AGENT_ADDRESS"],
                             token=os.environ.get("SIA_AGENT_TOKEN", ""))
    end = started + (app.restart_delay + path.duration) / scale
    print(f"{args.application}: {gpu_type} x{alloc.num_replicas} on {alloc.num_nodes} "
          f"node(s), atomic batch {alloc.atomic_batch_size}+{alloc.accum_steps} accum, from "
          f"progress {progress:.1f}/{app.max_progress:.1f}: {path.duration / 3600:.2f} h "
          f"modeled", flush=True)
    while not stop.wait(max(min(end - time.monotonic(), args.report_every), 0.0)):
        if client is not None and trained_s() > 0:
            steps = int(trained_s() / path.iteration_time)
            _report(client, app, gpu_type, alloc, path, path.progress(trained_s()), steps)
        if time.monotonic() >= end:
            break
    done = path.progress(trained_s())
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"progress": done}))
    tmp.replace(ckpt)  # (atomic: a kill mid-write leaves the last checkpoint)
    finished = done >= app.max_progress
    print(f"{'finished' if finished else 'stopped'} at progress {done:.1f}", flush=True)
    if client is not None:
        client.close()
    return 0 if finished else 143


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    p = argparse.ArgumentParser(prog="python -m sia_grpc.bench.slurm_worker",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("application")
    p.add_argument("--time-scale", type=float, required=True,
                   help="modeled seconds per real second")
    p.add_argument("--checkpoint", help="progress file (default SIA_CHECKPOINT_DIR/"
                                        "progress.json)")
    p.add_argument("--batch-size", type=int,
                   help="Slurm alone: this global batch on --gpus GPUs of one node")
    p.add_argument("--gpus", type=int, default=1, help="with --batch-size: the job's GPUs")
    p.add_argument("--node-type", action="append", default=[], metavar="NODE=GRES",
                   help="with --batch-size: a node's gres GPU type")
    p.add_argument("--report-every", type=float, default=1.0, metavar="SECONDS")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
