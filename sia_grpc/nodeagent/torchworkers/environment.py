"""The environment a worker starts with: `sia_grpc.train.contract`'s variables.

The torch.distributed variables (rendezvous on the loopback when the whole world
is on this node, else at the directive's master), the job's batch and target,
the SIA_* identity of the worker, and its devices (`affinity`); under emulation
SIA_PACE too.

Nothing else of the agent's own environment reaches a worker but what is listed
(`DEFAULT_PASS_ENV`, or the agent's `--worker-env`): the locale, the time zone and
the node's NCCL settings, never its credentials (SIA_TLS_*, tokens) or paths.
PATH is a minimal one that starts with the folder of the agent's Python, so a
command's `python` is the environment the agent runs workers with. The job's own
variables (`JobSpec.env`) come next, then the worker contract, which they cannot
override (the controller refuses a spec that tries).
"""

from __future__ import annotations

import fnmatch
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sia_grpc.nodeagent.backend import Launch
from sia_grpc.nodeagent.gpus import emulation_pace
from sia_grpc.nodeagent.torchworkers.affinity import Affinity
from sia_grpc.train import contract as c

__all__ = ["DEFAULT_PASS_ENV", "MANAGED_ENV", "base_env", "free_port", "launch_env",
           "rendezvous", "single_node", "worker_env"]

_TORCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT")
# Never inherited from the agent's own environment: set per worker or not at all.
MANAGED_ENV = frozenset((*_TORCH_ENV, "CUDA_VISIBLE_DEVICES", *(
    getattr(c, name) for name in c.__all__ if name.startswith("ENV_"))))


# Of the agent's environment, what a worker gets unless the operator says otherwise.
DEFAULT_PASS_ENV = ("LANG", "LC_*", "TZ", "NCCL_*")


def base_env(passed: Sequence[str] = DEFAULT_PASS_ENV,
             environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What every worker starts from: a minimal PATH and the agent's variables
    matching `passed` (never SIA_* nor what the agent sets per worker)."""
    path = [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
    env = {"PATH": ":".join(dict.fromkeys(path))}
    for key, value in environ.items():
        if (any(fnmatch.fnmatchcase(key, p) for p in passed) and not key.startswith("SIA_")
                and key not in MANAGED_ENV):
            env[key] = value
    return env


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether nothing listens on `port` on any local address. With SO_REUSEADDR, as
    torch's TCPStore binds: a port whose old connections linger in TIME_WAIT is free
    to it, one another socket listens on is not (Linux refuses that bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def single_node(launch: Launch) -> bool:
    """Whether the whole world of `launch` is on this node."""
    w = launch.world
    return w.rank_offset == 0 and (w.world_size or 0) <= len(launch.local_gpus)


def rendezvous(launch: Launch) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: on the loopback when the world is all here, at
    the directive's port unless something holds it (another job's store, on a host
    that runs several agents, or any other program: its rank 0 would fail to start
    with EADDRINUSE), then at any free port, since no other node needs to know it."""
    w = launch.world
    if single_node(launch):
        return "127.0.0.1", (w.master_port if w.master_port and port_free(w.master_port)
                             else free_port())
    return w.master_addr, w.master_port


def launch_env(launch: Launch, addr: str, port: int) -> dict[str, str]:
    """What all of this node's workers of `launch` share: world, batch and target."""
    w, n, a = launch.world, len(launch.local_gpus), launch.allocation
    env = {
        "WORLD_SIZE": str(w.world_size or n), "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": addr, "MASTER_PORT": str(port),
        c.ENV_BATCH_SIZE: str(a.batch_size), c.ENV_ATOMIC_BATCH_SIZE: str(a.atomic_batch_size),
        c.ENV_ACCUM_STEPS: str(a.accum_steps)}
    target = launch.spec.WhichOneof("target")
    if target == "epochs" and launch.spec.epochs > 0:
        env[c.ENV_TARGET_EPOCHS] = repr(float(launch.spec.epochs))
    elif target == "samples" and launch.spec.samples > 0:
        env[c.ENV_TARGET_SAMPLES] = str(launch.spec.samples)
    return env


def worker_env(*, job: str, generation: int, gpu: int, job_gpus: Sequence[int],
               checkpoint_dir: str, application: str, gpu_type: str, agent_socket: Path,
               agent_token: str, affinity: Affinity, base: Mapping[str, str],
               own: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of the worker on local GPU `gpu`: `base`, the job's
    `own` variables, the contract; `extra` comes last."""
    env = {**base, **{k: v for k, v in own.items() if k not in MANAGED_ENV}}
    env.update({
        c.ENV_JOB_ID: job, c.ENV_GENERATION: str(generation),
        c.ENV_AGENT_SOCKET: str(agent_socket), c.ENV_AGENT_TOKEN: agent_token,
        c.ENV_CHECKPOINT_DIR: checkpoint_dir, c.ENV_GPU_TYPE: gpu_type})
    env.update(affinity.env(gpu, job_gpus))
    if affinity.emulate:
        env[c.ENV_PACE] = f"{emulation_pace(gpu_type, application):.6g}"
    env.update(extra)
    return env
