"""Support for the torch back-end's tests: a stand-in training worker that speaks
the agent↔worker contract (environment, exit codes, WorkerService over the Unix
socket) without torch, and helpers to watch processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from sia_grpc.api import WorkerServiceStub, pb
from sia_grpc.nodeagent import Launch
from sia_grpc.nodeagent.torchbackend import TorchBackend
from sia_grpc.testing.ports import free_port

WAIT_S = 15.0  # real seconds for a worker to do something (Python start-up on a busy box)

# The stand-in worker. argv: MODE [ARGS]. Every mode first writes
# $SIA_CHECKPOINT_DIR/ready-<RANK> (its pid) once its SIGTERM handler is set.
WORKER = r'''
import json, os, signal, sys, time

mode = sys.argv[1]
rank = int(os.environ["RANK"])
out = os.environ["SIA_CHECKPOINT_DIR"]

def report(**kw):
    import grpc
    from sia_grpc.api import WorkerServiceStub, pb
    with grpc.insecure_channel("unix:" + os.environ["SIA_AGENT_SOCKET"]) as ch:
        telemetry = kw.pop("telemetry", {})
        t = pb.Telemetry(job_id=os.environ["SIA_JOB_ID"],
                         generation=int(os.environ["SIA_GENERATION"]), **telemetry)
        return WorkerServiceStub(ch).Report(
            pb.WorkerReport(telemetry=t, rank=rank, **kw), timeout=10,
            metadata=(("authorization", "Bearer " + os.environ["SIA_AGENT_TOKEN"]),))

def on_term(signum, frame):
    open(os.path.join(out, f"terminated-{rank}"), "w").close()
    if mode == "train" and rank == 0:
        report(telemetry=dict(progress=0.4, checkpoint=pb_checkpoint()))
    sys.exit(75)

def pb_checkpoint():
    from sia_grpc.api import pb
    return pb.CheckpointEvent(generation=int(os.environ["SIA_GENERATION"]), path=out,
                              progress=0.4, save_s=0.01)

def ready():
    with open(os.path.join(out, f"ready-{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out, f"ready-{rank}.tmp"), os.path.join(out, f"ready-{rank}"))

def wait_forever():
    while True:
        time.sleep(0.05)

signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else on_term)

if mode == "env":
    keys = [k for k in os.environ if k.startswith("SIA_") or k in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")]
    env = {k: os.environ[k] for k in keys}
    env["affinity"] = sorted(os.sched_getaffinity(0))
    with open(os.path.join(out, f"env-{rank}.json"), "w") as f:
        json.dump(env, f)
    ready()
    wait_forever()
elif mode == "train":
    if rank == 0:
        reply = report(telemetry=dict(progress=0.3), startup_s=1.5)
        with open(os.path.join(out, "reply.json"), "w") as f:
            json.dump({"current": reply.current}, f)
    ready()
    wait_forever()
elif mode in ("ignore-term", "sleep"):
    ready()
    wait_forever()
elif mode == "crash":
    ready()
    if rank == int(sys.argv[2]):
        for i in range(30):
            print(f"step {i}")
        print("Traceback: something broke", flush=True)
        time.sleep(0.2)
        sys.exit(3)
    wait_forever()
elif mode == "complete":
    ready()
    time.sleep(0.2)
    sys.exit(0)
elif mode == "oom":
    from sia_grpc.api import pb
    report(oom=pb.OomEvent(atomic_batch_size=512, message="CUDA out of memory"))
    ready()
    print("RuntimeError: CUDA out of memory", flush=True)
    sys.exit(1)
elif mode == "profile":
    from sia_grpc.api import pb
    sizes = [int(b) for b in os.environ["SIA_PROFILE"].split(",")]
    samples = [pb.ThroughputSample(gpu_type=os.environ["SIA_GPU_TYPE"], num_nodes=1,
                                   num_replicas=1, atomic_batch_size=b,
                                   step_time_s=0.001 * b, sync_time_s=0.0, count=3)
               for b in sizes]
    report(telemetry=dict(profile=True, samples=samples,
                          grad=pb.GradientStats(sqr=1.0, var=2.0)))
    ready()
    sys.exit(76)
elif mode == "exit":
    ready()
    sys.exit(int(sys.argv[2]))
'''


def write_worker(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def command(worker: Path, *args: str) -> list[str]:
    return [sys.executable, str(worker), *args]


def launch(job_id: str, cmd: list[str], *, generation: int = 1, gpus: tuple[int, ...] = (0,),
           world_size: int | None = None, rank_offset: int = 0, restore: float = 0.0,
           checkpoint_path: str = "", **spec: Any) -> Launch:
    """A RUN for `job_id`; its world's master port is a free one (the stand-in workers
    never bind it, but a real torch worker would)."""
    n = len(gpus)
    alloc = pb.Allocation(gpu_type="rtx", num_gpus=n, num_nodes=1, num_replicas=n,
                          atomic_batch_size=32, accum_steps=1, batch_size=64 * n)
    world = pb.WorldLayout(world_size=world_size or n, rank_offset=rank_offset,
                           master_addr="node-a", master_port=free_port(), nodes=["node-a"])
    return Launch(job_id=job_id, generation=generation, local_gpus=gpus,
                  spec=pb.JobSpec(name=job_id, application="cifar10", command=cmd, **spec),
                  allocation=alloc, world=world, restore_progress=restore,
                  checkpoint_path=checkpoint_path)


def make_backend(tmp_path: Path, **kw: Any) -> TorchBackend:
    fields: dict[str, Any] = dict(workdir=tmp_path / "agent", emulate=True, stop_grace_s=5.0,
                                  cpus=[0, 1])
    fields.update(kw)
    gpu_type = fields.pop("gpu_type", "rtx")
    num_gpus = fields.pop("num_gpus", 2)
    return TorchBackend(gpu_type, num_gpus, **fields)


async def wait_file(path: Path, timeout: float = WAIT_S) -> str:
    async with asyncio.timeout(timeout):
        while not path.exists():
            await asyncio.sleep(0.01)
    return path.read_text()


async def ready_pids(ckpt: Path, ranks: range | list[int]) -> list[int]:
    return [int(await wait_file(ckpt / f"ready-{r}")) for r in ranks]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed but not yet reaped by its new parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


async def until_dead(pids: list[int], timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while any(alive(p) for p in pids):
            await asyncio.sleep(0.02)


async def report(channel: tuple[Path, str], job_id: str, generation: int,
                 **kw: Any) -> pb.WorkerReply:
    """A Report to the agent's WorkerService through a generation's gate with its
    secret (`TorchBackend.channel`), as a worker sends it (the real stub)."""
    socket, token = channel
    telemetry = kw.pop("telemetry", {})
    async with grpc.aio.insecure_channel(f"unix:{socket}") as ch:
        return await WorkerServiceStub(ch).Report(pb.WorkerReport(
            telemetry=pb.Telemetry(job_id=job_id, generation=generation, **telemetry), **kw),
            timeout=10, metadata=(("authorization", f"Bearer {token}"),) if token else ())


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
