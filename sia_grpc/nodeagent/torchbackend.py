"""Real workers: one process per local GPU running the job's own command.

Each ACTION_RUN generation on this node is one static group of workers, one per
local GPU, with the environment of `sia_grpc.train.contract` (the torch.distributed
variables plus SIA_*). The group's global rank 0 reports to the agent over
WorkerService on a Unix socket (`workerservice`); the reports become the job's
telemetry, and the replies carry an in-place batch change and the generation
fence. Processes are managed by `workers`: own session, killed with the agent,
stopped with SIGTERM, a grace period, then SIGKILL. Exit statuses say how a
group ended (EXIT_CHECKPOINTED, EXIT_COMPLETED, anything else failed).

On real GPUs every worker of a job sees the job's local GPUs, in local-rank order,
as CUDA_VISIBLE_DEVICES, so `cuda:LOCAL_RANK` is its own GPU (as under torchrun).
With `emulate=True` (`--emulate TYPE:COUNT`) THERE ARE NO GPUS: workers run on
the CPU with CUDA_VISIBLE_DEVICES empty, each emulated GPU owns an equal share of
the agent's CPU cores (affinity and OMP_NUM_THREADS), and SIA_PACE stretches
their steps to the declared type's relative speed (`gpus.emulation_pace`).

Layout under the work directory:
    agent.sock, agent.lock                  the WorkerService socket; one agent per workdir
    jobs/<job>/gen-<generation>/rank-<r>.log    each worker's stdout and stderr
    jobs/<job>/profile-gen-<g>-gpu-<i>.log      a profiling pass
    checkpoints/<job>/                      SIA_CHECKPOINT_DIR, unless the directive
                                            names one or --checkpoint-root moves it
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import re
import shutil
import signal
import socket
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from sia_grpc.api import pb
from sia_grpc.nodeagent.backend import ExitCallback, Launch
from sia_grpc.nodeagent.gpus import emulation_pace
from sia_grpc.nodeagent.workers import (
    WorkerProcess,
    describe_exit,
    log_tail,
    spawn_worker,
)
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator, WorkerServiceServer
from sia_grpc.train import contract as c

try:
    import fcntl
except ImportError:  # not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_PROFILE_TIMEOUT_S", "DEFAULT_STOP_GRACE_S", "TorchBackend"]

DEFAULT_STOP_GRACE_S = 30.0
DEFAULT_PROFILE_TIMEOUT_S = 600.0
_CLOSE_WAIT_S = 10.0  # close(): how long SIGKILLed workers get to be reaped

_TORCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT")
# Never inherited from the agent's own environment: set per worker or not at all.
_MANAGED_ENV = frozenset((*_TORCH_ENV, "CUDA_VISIBLE_DEVICES", *(
    getattr(c, name) for name in c.__all__ if name.startswith("ENV_"))))
_OK_EXITS = (c.EXIT_COMPLETED, c.EXIT_CHECKPOINTED)


def safe_name(job_id: str) -> str:
    """`job_id` as one path component: other characters become `_`, and a changed
    name gets a checksum so that two ids never share a directory."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", job_id)
    if name != job_id or name in ("", ".", ".."):
        name = f"{name}-{zlib.crc32(job_id.encode()):08x}"
    return name


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _writable_dir(path: Path) -> str:
    """Why `path` cannot be (made) a writable directory, "" if it can."""
    p = path.absolute()
    while not p.exists():
        if p.parent == p:
            return f"{path}: no existing parent"
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{p} is not writable by the agent"
    return ""


@dataclass(eq=False)
class _Group:
    """One generation of a job on this node: its workers and what they said."""

    launch: Launch
    procs: list[WorkerProcess]
    checkpoint_dir: str
    log_dir: Path
    accum: TelemetryAccumulator
    log: Any
    on_exit: ExitCallback | None
    result: asyncio.Future[pb.JobExit]
    pending: pb.Allocation | None = None  # a new batch for the next reply
    stop_requested: bool = False  # stop(): exit 75 means checkpointed
    stopping: bool = False  # stop() or close(): no on_exit
    exits: list[WorkerProcess] = field(default_factory=list)  # in exit order
    all_exited: asyncio.Event = field(default_factory=asyncio.Event)
    terminator: asyncio.Task[None] | None = None
    term_delayed: bool = False
    killed_after_grace: set[int] = field(default_factory=set)  # ranks
    oom: pb.OomEvent | None = None
    restore_noted: bool = False
    supervisor: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _ProfileRun:
    accum: TelemetryAccumulator
    proc: WorkerProcess | None = None
    oom: pb.OomEvent | None = None


class TorchBackend:
    """`WorkerBackend` that runs the job's command as real worker processes.

    `workdir` holds the socket, logs and (by default) checkpoints; one agent per
    workdir. `stop_grace_s`: SIGTERM to SIGKILL. `emulate`: workers on the CPU,
    paced as `gpu_type` (see the module docstring). `cpus`: the cores emulated
    GPUs share (default: the agent's affinity).
    """

    def __init__(self, gpu_type: str, num_gpus: int, *, workdir: str | os.PathLike[str],
                 checkpoint_root: str | os.PathLike[str] | None = None,
                 emulate: bool = False, stop_grace_s: float = DEFAULT_STOP_GRACE_S,
                 profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S, node_id: str = "",
                 cpus: list[int] | None = None) -> None:
        if not gpu_type:
            raise ValueError("gpu_type: must not be empty")
        if num_gpus < 1:
            raise ValueError(f"num_gpus: must be >= 1, got {num_gpus}")
        if not (stop_grace_s >= 0 and math.isfinite(stop_grace_s)):
            raise ValueError(f"stop_grace_s: must be >= 0, got {stop_grace_s!r}")
        if not (profile_timeout_s > 0 and math.isfinite(profile_timeout_s)):
            raise ValueError(f"profile_timeout_s: must be positive, got {profile_timeout_s!r}")
        if emulate:
            emulation_pace(gpu_type)  # a type the shipped profiles know, or ValueError
        self.gpu_type, self.num_gpus, self.emulate = gpu_type, num_gpus, emulate
        self.workdir = Path(workdir).absolute()
        self.checkpoint_root = (Path(checkpoint_root).absolute() if checkpoint_root
                                else self.workdir / "checkpoints")
        self.stop_grace_s, self.profile_timeout_s = float(stop_grace_s), float(profile_timeout_s)
        if cpus is None:
            cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else list(range(os.cpu_count() or 1)))
        if not cpus:
            raise ValueError("cpus: must not be empty")
        self.cpus = list(cpus)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        # The agent's own CUDA_VISIBLE_DEVICES: local GPU i is its i-th entry.
        self._visible = None if visible is None else [
            d.strip() for d in visible.split(",") if d.strip()]
        self._log = structlog.get_logger().bind(node_id=node_id, backend="torch")
        self._groups: dict[str, _Group] = {}
        self._reports: dict[tuple[str, int], TelemetryAccumulator] = {}
        self._profile_runs: dict[tuple[str, int], _ProfileRun] = {}
        self._server: WorkerServiceServer | None = None
        self._lock_fd: int | None = None
        self._open_lock = asyncio.Lock()
        self._close_task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def socket_path(self) -> Path | None:
        """The WorkerService socket, once `open()`."""
        return None if self._server is None else self._server.path

    async def open(self) -> None:
        """Create the work directory, lock it and start WorkerService. Idempotent;
        `start` and `profile` call it, an agent may call it early to fail fast."""
        async with self._open_lock:
            if self._closed:
                raise RuntimeError("TorchBackend: closed")
            if self._server is not None:
                return
            self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._lock_workdir()
            server = WorkerServiceServer(self.workdir, self._on_report)
            try:
                await server.start()
            except BaseException:
                self._unlock_workdir()
                raise
            self._server = server
        self._log.info("worker service listening", socket=str(server.path),
                       workdir=str(self.workdir), checkpoint_root=str(self.checkpoint_root),
                       gpu_type=self.gpu_type, num_gpus=self.num_gpus,
                       stop_grace_s=self.stop_grace_s)
        if self.emulate:
            self._log.warning(
                "EMULATION: no GPU is used; workers run on the CPU, paced as GPU type "
                f"{self.gpu_type!r}", pace=round(emulation_pace(self.gpu_type), 3),
                cpus=self.cpus)

    def _lock_workdir(self) -> None:
        if fcntl is None:
            return
        fd = os.open(self.workdir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"workdir {self.workdir} is in use by another agent; give "
                               f"each agent its own --workdir") from None
        self._lock_fd = fd

    def _unlock_workdir(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the lock

    async def close(self) -> None:
        """SIGKILL every worker and profiling pass without reporting, reap them,
        stop WorkerService. Safe to call twice."""
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._close(), name="nodeagent:torch:close")
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        self._closed = True
        groups = list(self._groups.values())
        for g in groups:
            g.stopping = True
            for p in g.procs:
                p.signal_group(signal.SIGKILL)
        for run in self._profile_runs.values():
            if run.proc is not None:
                run.proc.signal_group(signal.SIGKILL)
        sups = [g.supervisor for g in groups if g.supervisor is not None]
        if sups:
            _, late = await asyncio.wait(sups, timeout=_CLOSE_WAIT_S)
            for t in late:
                t.cancel()
            await asyncio.gather(*sups, return_exceptions=True)
        async with self._open_lock:
            if self._server is not None:
                await self._server.stop()
            self._unlock_workdir()
        if groups:
            self._log.info("workers killed on close", jobs=[g.launch.job_id for g in groups])

    # -- WorkerBackend ------------------------------------------------------------------

    def check(self, launch: Launch) -> None:
        self._check_command(list(launch.spec.command))
        gpus = launch.local_gpus
        if not gpus:
            raise ValueError("local_gpus: empty")
        if bad := [g for g in gpus if g >= self.num_gpus]:
            raise ValueError(f"local_gpus: GPU {bad[0]} does not exist (this node has GPUs "
                             f"0..{self.num_gpus - 1})")
        launch.check_gpu_type(self.gpu_type)
        w = launch.world
        world_size = w.world_size or len(gpus)
        if world_size < w.rank_offset + len(gpus):
            raise ValueError(f"world: world_size {world_size} < rank_offset {w.rank_offset} "
                             f"+ {len(gpus)} local GPUs")
        if not self._single_node(launch) and not (w.master_addr and w.master_port):
            raise ValueError("world: a multi-node job needs master_addr and master_port")
        if not 0.0 <= launch.restore_progress <= 1.0:
            raise ValueError(f"restore_progress: must be a fraction in [0, 1], got "
                             f"{launch.restore_progress!r}")
        if why := _writable_dir(Path(self._checkpoint_dir(launch))):
            raise ValueError(f"checkpoint directory: {why}")

    def _check_command(self, command: list[str]) -> None:
        if not command or not command[0]:
            raise ValueError("spec.command: empty; real workers need the training command "
                             "as an argument list, e.g. [python, train.py]")
        exe = command[0]
        if os.sep in exe:
            if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
                raise ValueError(f"spec.command: {exe!r} is not an executable file")
        elif shutil.which(exe) is None:
            raise ValueError(f"spec.command: {exe!r} not found on the agent's PATH")

    async def start(self, launch: Launch, on_exit: ExitCallback) -> None:
        self.check(launch)
        await self.open()
        old = self._groups.get(launch.job_id)
        if old is not None:
            if old.launch.generation >= launch.generation:
                raise ValueError(f"job {launch.job_id!r} already runs here (generation "
                                 f"{old.launch.generation})")
            old.log.info("stopping the older generation first", new=launch.generation)
            ended = await self.stop(launch.job_id)
            old.log.info("older generation stopped", kind=pb.JobExit.Kind.Name(ended.kind))
        ckpt = self._checkpoint_dir(launch)
        try:
            Path(ckpt).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"checkpoint directory {ckpt}: {exc.strerror or exc}") from None
        job, gen = launch.job_id, launch.generation
        log_dir = self.workdir / "jobs" / safe_name(job) / f"gen-{gen}"
        w, n = launch.world, len(launch.local_gpus)
        if self._single_node(launch):  # the whole world is here: rendezvous on loopback
            addr, port = "127.0.0.1", w.master_port or free_port()
        else:
            addr, port = w.master_addr, w.master_port
        a = launch.allocation
        common = {
            "WORLD_SIZE": str(w.world_size or n), "LOCAL_WORLD_SIZE": str(n),
            "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            c.ENV_BATCH_SIZE: str(a.batch_size), c.ENV_ATOMIC_BATCH_SIZE: str(a.atomic_batch_size),
            c.ENV_ACCUM_STEPS: str(a.accum_steps)}
        target = launch.spec.WhichOneof("target")
        if target == "epochs" and launch.spec.epochs > 0:
            common[c.ENV_TARGET_EPOCHS] = repr(float(launch.spec.epochs))
        elif target == "samples" and launch.spec.samples > 0:
            common[c.ENV_TARGET_SAMPLES] = str(launch.spec.samples)
        accum = TelemetryAccumulator(job, gen, self.gpu_type)
        procs: list[WorkerProcess] = []
        try:
            for i, gpu in enumerate(launch.local_gpus):
                rank = w.rank_offset + i
                env = self._env(job, gen, gpu, launch.local_gpus, ckpt, launch.spec.application,
                                {**common, "RANK": str(rank), "LOCAL_RANK": str(i)})
                procs.append(spawn_worker(list(launch.spec.command), env,
                                          log_dir / f"rank-{rank}.log", rank=rank, local_rank=i,
                                          cpus=self._cpu_share(gpu) if self.emulate else None))
        except OSError as exc:
            for p in procs:
                p.kill_and_reap()
            raise ValueError(f"spec.command: cannot start {launch.spec.command[0]!r}: "
                             f"{exc.strerror or exc}") from None
        log = self._log.bind(job_id=job, generation=gen)
        g = _Group(launch, procs, ckpt, log_dir, accum, log, on_exit,
                   asyncio.get_running_loop().create_future())
        self._groups[job] = g
        self._reports[(job, gen)] = accum
        g.supervisor = asyncio.create_task(self._supervise(g), name=f"nodeagent:torch:{job}")
        log.info("workers started", pids=[p.pid for p in procs], gpus=list(launch.local_gpus),
                 ranks=[p.rank for p in procs], logs=str(log_dir), checkpoint_dir=ckpt,
                 master=f"{addr}:{port}", emulated=self.emulate)

    async def stop(self, job_id: str) -> pb.JobExit:
        g = self._groups[job_id]
        g.stopping = g.stop_requested = True
        self._terminate(g)
        return await asyncio.shield(g.result)

    def allocation(self, job_id: str) -> pb.Allocation:
        return self._groups[job_id].launch.allocation

    async def rebatch(self, job_id: str, allocation: pb.Allocation) -> None:
        g = self._groups[job_id]
        g.launch = dataclasses.replace(g.launch, allocation=allocation)
        g.pending = allocation
        g.log.info("new batch for the next report's reply", batch=allocation.batch_size,
                   atomic=allocation.atomic_batch_size, accum=allocation.accum_steps)

    async def profile(self, request: pb.ProfileRequest) -> pb.Telemetry:
        command = list(request.spec.command)
        self._check_command(command)
        if not request.local_batch_sizes:
            raise ValueError("local_batch_sizes: empty")
        if request.local_gpu >= self.num_gpus:
            raise ValueError(f"local_gpu: GPU {request.local_gpu} does not exist")
        await self.open()
        job, gen, gpu = request.job_id, request.generation, request.local_gpu
        key = (job, gen)
        if key in self._profile_runs:
            raise ValueError(f"job {job!r} generation {gen} is already being profiled here")
        log = self._log.bind(job_id=job, generation=gen, gpu=gpu)
        log_path = self.workdir / "jobs" / safe_name(job) / f"profile-gen-{gen}-gpu-{gpu}.log"
        ckpt = str(self.checkpoint_root / safe_name(job))
        try:  # it always exists for a worker, though a profiling pass must not write to it
            Path(ckpt).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"checkpoint directory {ckpt}: {exc.strerror or exc}") from None
        env = self._env(job, gen, gpu, (gpu,), ckpt, request.spec.application, {
            "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            c.ENV_PROFILE: ",".join(str(b) for b in request.local_batch_sizes)})
        run = _ProfileRun(TelemetryAccumulator(job, gen, self.gpu_type))
        self._profile_runs[key] = run
        try:
            try:
                run.proc = proc = spawn_worker(command, env, log_path,
                                               cpus=self._cpu_share(gpu) if self.emulate else None)
            except OSError as exc:
                raise ValueError(f"spec.command: cannot start {command[0]!r}: "
                                 f"{exc.strerror or exc}") from None
            log.info("profiling", pid=proc.pid, sizes=list(request.local_batch_sizes),
                     log=str(log_path))
            try:
                async with asyncio.timeout(self.profile_timeout_s):
                    code = await proc.wait()
            except TimeoutError:
                raise RuntimeError(f"profiling pass still running after "
                                   f"{self.profile_timeout_s:g} s; killed (log {log_path})"
                                   ) from None
        finally:
            if run.proc is not None:
                if run.proc.returncode is None:
                    run.proc.kill_and_reap()
                else:
                    run.proc.signal_group(signal.SIGKILL)  # what it forked
            del self._profile_runs[key]
        if code != c.EXIT_PROFILED:
            oom = f"; {_oom_text(run.oom)}" if run.oom is not None else ""
            raise RuntimeError(f"profiling pass ended with {describe_exit(code)}, not "
                               f"{c.EXIT_PROFILED}{oom}\nlog {log_path}:\n{log_tail(log_path)}")
        out = run.accum.take(profile=True)
        if out is None or not out.samples:
            raise RuntimeError(f"profiling pass reported no samples (log {log_path})")
        log.info("profiled", sizes=[s.atomic_batch_size for s in out.samples])
        return out

    def running(self) -> list[pb.RunningJob]:
        return [pb.RunningJob(job_id=j, generation=g.launch.generation,
                              local_gpus=g.launch.local_gpus) for j, g in self._groups.items()]

    def telemetry(self) -> list[pb.Telemetry]:
        out = []
        for key, acc in list(self._reports.items()):
            if (t := acc.take()) is not None:
                out.append(t)
            g = self._groups.get(key[0])
            if g is None or g.launch.generation != key[1]:
                del self._reports[key]  # ended: this was its last word
        return out

    # -- worker environment -------------------------------------------------------------

    def _single_node(self, launch: Launch) -> bool:
        w = launch.world
        return w.rank_offset == 0 and (w.world_size or 0) <= len(launch.local_gpus)

    def _checkpoint_dir(self, launch: Launch) -> str:
        return launch.checkpoint_path or str(self.checkpoint_root / safe_name(launch.job_id))

    def _cpu_share(self, gpu: int) -> list[int]:
        """The cores of emulated GPU `gpu`: an equal slice of the agent's, so a job
        runs at the same speed however many other jobs share the node."""
        n, cores = self.num_gpus, self.cpus
        if len(cores) >= n:
            return cores[gpu * len(cores) // n:(gpu + 1) * len(cores) // n]
        return [cores[gpu % len(cores)]]

    def _device(self, gpu: int) -> str:
        if self._visible is not None and gpu < len(self._visible):
            return self._visible[gpu]
        return str(gpu)

    def _env(self, job: str, generation: int, gpu: int, job_gpus: tuple[int, ...] | list[int],
             checkpoint_dir: str, application: str, extra: dict[str, str]) -> dict[str, str]:
        assert self._server is not None
        env = {k: v for k, v in os.environ.items() if k not in _MANAGED_ENV}
        env.update({
            c.ENV_JOB_ID: job, c.ENV_GENERATION: str(generation),
            c.ENV_AGENT_SOCKET: str(self._server.path), c.ENV_CHECKPOINT_DIR: checkpoint_dir,
            c.ENV_GPU_TYPE: self.gpu_type})
        if self.emulate:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU only, even on a machine with GPUs
            env["OMP_NUM_THREADS"] = str(len(self._cpu_share(gpu)))
            env[c.ENV_PACE] = f"{emulation_pace(self.gpu_type, application):.6g}"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self._device(g) for g in job_gpus)
        env.update(extra)
        return env

    # -- worker groups ------------------------------------------------------------------

    def _terminate(self, g: _Group, delay: float = 0.0) -> None:
        """SIGTERM the group's live workers (after `delay`), SIGKILL after the grace.
        A delayed termination is replaced by an immediate one."""
        if g.terminator is not None:
            if not g.term_delayed or delay:
                return
            g.terminator.cancel()
        g.term_delayed = delay > 0
        g.terminator = asyncio.create_task(
            self._terminate_after(g, delay), name=f"nodeagent:torch:stop:{g.launch.job_id}")

    async def _terminate_after(self, g: _Group, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
            g.term_delayed = False
        live = [p for p in g.procs if p.returncode is None]
        if not live:
            return
        g.log.info("stopping workers: SIGTERM", ranks=[p.rank for p in live],
                   grace_s=self.stop_grace_s)
        for p in live:
            p.signal_group(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.stop_grace_s):
                await g.all_exited.wait()
        except TimeoutError:
            late = [p for p in g.procs if p.returncode is None]
            g.log.warning("workers still running after the stop grace: SIGKILL",
                          ranks=[p.rank for p in late], grace_s=self.stop_grace_s)
            g.killed_after_grace.update(p.rank for p in late)
            for p in late:
                p.signal_group(signal.SIGKILL)

    async def _supervise(self, g: _Group) -> None:
        """Wait for the group to end, stop the rest when a rank fails, and report."""
        try:
            await self._wait_group(g)
        finally:
            if g.terminator is not None:
                g.terminator.cancel()
            for p in g.procs:
                if p.returncode is None:  # only when cancelled
                    p.kill_and_reap()
                else:
                    p.signal_group(signal.SIGKILL)  # sweep what it forked
            exit_ = self._exit_of(g)
            if self._groups.get(g.launch.job_id) is g:
                del self._groups[g.launch.job_id]  # GPUs free before anyone hears of it
            if not g.result.done():
                g.result.set_result(exit_)
            g.log.info("workers ended", kind=pb.JobExit.Kind.Name(exit_.kind),
                       progress=exit_.progress,
                       exits={p.rank: describe_exit(p.returncode) for p in g.exits})
        if not g.stopping and g.on_exit is not None:
            try:
                g.on_exit(exit_)
            except Exception:  # the agent's callback: log it, nobody awaits this task
                g.log.exception("exit callback failed")

    async def _wait_group(self, g: _Group) -> None:
        waits = {asyncio.create_task(p.wait(), name=f"nodeagent:torch:wait:{p.pid}"): p
                 for p in g.procs}
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    p = waits[t]
                    g.exits.append(p)
                    g.log.info("worker exited", rank=p.rank, pid=p.pid,
                               status=describe_exit(t.result()))
                if pending and not g.stopping:
                    if any(p.returncode != c.EXIT_COMPLETED for p in g.exits):
                        self._terminate(g)  # a rank failed: stop its siblings
                    else:  # ranks completed: the others should follow within the grace
                        self._terminate(g, delay=self.stop_grace_s)
            g.all_exited.set()
        finally:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def _exit_of(self, g: _Group) -> pb.JobExit:
        launch = g.launch
        ckpt = g.accum.checkpoint_progress
        held = launch.restore_progress if ckpt is None else ckpt
        out = pb.JobExit(job_id=launch.job_id, generation=launch.generation)
        order = g.exits + [p for p in g.procs if p not in g.exits]
        codes = {p.rank: -signal.SIGKILL if p.returncode is None else p.returncode
                 for p in order}
        bad = [p for p in order if codes[p.rank] not in _OK_EXITS]
        if bad:
            out.kind, out.progress = pb.JobExit.KIND_FAILED, held
            out.message = self._failure(g, bad, codes)
        elif all(code == c.EXIT_COMPLETED for code in codes.values()):
            out.kind, out.progress = pb.JobExit.KIND_COMPLETED, 1.0
        elif g.stop_requested:
            out.kind, out.progress = pb.JobExit.KIND_CHECKPOINTED, held
        elif any(code == c.EXIT_COMPLETED for code in codes.values()):
            out.kind, out.progress = pb.JobExit.KIND_COMPLETED, 1.0  # the rest on our SIGTERM
        else:
            out.kind, out.progress = pb.JobExit.KIND_FAILED, held
            out.message = (f"workers exited {c.EXIT_CHECKPOINTED} (checkpointed) without being "
                           f"asked to stop; log {g.log_dir}")
        return out

    def _failure(self, g: _Group, bad: list[WorkerProcess], codes: dict[int, int]) -> str:
        first = bad[0]
        what = f"rank {first.rank} {describe_exit(codes[first.rank])}"
        if first.rank in g.killed_after_grace:
            what += f" (still running {self.stop_grace_s:g} s after SIGTERM)"
        parts = [what]
        if others := [f"rank {p.rank} {describe_exit(codes[p.rank])}" for p in bad[1:]]:
            parts.append("also " + ", ".join(others))
        if g.oom is not None:
            parts.append(_oom_text(g.oom))
        tail = log_tail(first.log_path)
        return "; ".join(parts) + f"\nlog {first.log_path}:\n{tail}"

    # -- WorkerService ------------------------------------------------------------------

    def _on_report(self, report: pb.WorkerReport) -> pb.WorkerReply:
        t = report.telemetry
        job, gen = t.job_id, t.generation
        g = self._groups.get(job)
        run = self._profile_runs.get((job, gen))
        if g is not None and g.launch.generation == gen and not (run is not None and t.profile):
            # Rank 0 speaks for the job; other ranks report only out-of-memory errors.
            leader = report.rank == 0
            if leader:
                g.accum.add(t)
            if leader and report.startup_s > 0 and not g.restore_noted:
                g.restore_noted = True
                if g.launch.restore_progress > 0:  # its start-up restored a checkpoint
                    g.accum.restored(report.startup_s, g.checkpoint_dir,
                                     g.launch.restore_progress)
                g.log.info("workers started training", startup_s=round(report.startup_s, 3),
                           restored=g.launch.restore_progress > 0)
            if report.HasField("oom"):
                g.oom = report.oom
                g.log.warning("worker out of memory", rank=report.rank,
                              atomic_batch_size=report.oom.atomic_batch_size,
                              message=report.oom.message)
            reply = pb.WorkerReply(current=True)
            if leader and (a := g.pending) is not None:
                g.pending = None
                reply.batch_size, reply.atomic_batch_size, reply.accum_steps = (
                    a.batch_size, a.atomic_batch_size, a.accum_steps)
            return reply
        if run is not None:
            run.accum.add(t)
            if report.HasField("oom"):
                run.oom = report.oom
                self._log.warning("worker out of memory while profiling", job_id=job,
                                  atomic_batch_size=report.oom.atomic_batch_size,
                                  message=report.oom.message)
            return pb.WorkerReply(current=True)
        self._log.info("report from a worker not running here now: current=false",
                       job_id=job, generation=gen, rank=report.rank,
                       running=None if g is None else g.launch.generation)
        return pb.WorkerReply(current=False)


def _oom_text(oom: pb.OomEvent) -> str:
    text = f"out of memory at atomic_batch_size={oom.atomic_batch_size}"
    return f"{text}: {oom.message}" if oom.message else text

