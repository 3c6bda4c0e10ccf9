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

`TorchBackend` here checks directives and ties the parts together; the parts
are in `sia_grpc.nodeagent.torchworkers`:

    workdir       the work directory's layout and lock, safe names
    affinity      which GPUs and CPU cores a worker gets
    environment   a worker's environment (rendezvous, batch, target, SIA_*)
    group         a generation's workers: launch, stop, supervision
    exits         how a group ended (JobExit)
    profiling     a profiling pass
    reports       what the workers' reports add up to, and the replies

The layout of the work directory is in `torchworkers.workdir`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from sia_grpc.api import pb
from sia_grpc.names import job_key
from sia_grpc.nodeagent.backend import ExitCallback, Launch
from sia_grpc.nodeagent.gpus import emulation_pace
from sia_grpc.nodeagent.isolation.files import JobFolders
from sia_grpc.nodeagent.isolation.levels import Level
from sia_grpc.nodeagent.isolation.node import NodeIsolation, Space
from sia_grpc.nodeagent.plausibility import Bounds, bounds_for, check_report
from sia_grpc.nodeagent.torchworkers.affinity import Affinity, agent_cpus
from sia_grpc.nodeagent.torchworkers.environment import (
    DEFAULT_PASS_ENV,
    base_env,
    free_port,
    launch_env,
    rendezvous,
    single_node,
    worker_env,
)
from sia_grpc.nodeagent.torchworkers.exits import memory_note
from sia_grpc.nodeagent.torchworkers.group import WorkerGroup, spawn_ranks
from sia_grpc.nodeagent.torchworkers.profiling import ProfileRun, profile_env
from sia_grpc.nodeagent.torchworkers.reports import drain, on_report
from sia_grpc.nodeagent.torchworkers.workdir import (
    WorkdirLock,
    generation_log_dir,
    profile_log_path,
    safe_name,
    writable_dir,
)
from sia_grpc.nodeagent.workergate import WorkerGate
from sia_grpc.nodeagent.workerservice import TelemetryAccumulator, WorkerServiceServer

__all__ = ["DEFAULT_PROFILE_TIMEOUT_S", "DEFAULT_STOP_GRACE_S", "TorchBackend", "free_port",
           "safe_name"]

DEFAULT_STOP_GRACE_S = 30.0
DEFAULT_PROFILE_TIMEOUT_S = 600.0
_CLOSE_WAIT_S = 10.0  # close(): how long SIGKILLed workers get to be reaped


class TorchBackend:
    """`WorkerBackend` that runs the job's command as real worker processes.

    `workdir` holds the socket, logs and (by default) checkpoints; one agent per
    workdir. `stop_grace_s`: SIGTERM to SIGKILL. `emulate`: workers on the CPU,
    paced as `gpu_type` (see the module docstring). `cpus`: the cores emulated
    GPUs share (default: the agent's affinity).
    """

    held_back_retry_s = 10.0  # how often GPUs held back try their release again

    def __init__(self, gpu_type: str, num_gpus: int, *, workdir: str | os.PathLike[str],
                 checkpoint_root: str | os.PathLike[str] | None = None,
                 emulate: bool = False, stop_grace_s: float = DEFAULT_STOP_GRACE_S,
                 profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S, node_id: str = "",
                 cpus: list[int] | None = None, isolation: NodeIsolation | None = None,
                 pass_env: Sequence[str] = DEFAULT_PASS_ENV) -> None:
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
            cpus = agent_cpus()
        if not cpus:
            raise ValueError("cpus: must not be empty")
        self.cpus = list(cpus)
        self._affinity = Affinity.of_agent(num_gpus, self.cpus, emulate)
        self._log = structlog.get_logger().bind(node_id=node_id, backend="torch")
        # Without an isolation of the operator's: none (the library's default; the
        # agent's command line fails closed instead, `__main__`).
        self.isolation = isolation or NodeIsolation(Level.NONE, JobFolders(self.workdir / "run"))
        self._base_env = base_env(pass_env)
        self._tokens: dict[str, tuple[str, int, Bounds]] = {}  # secret -> job, generation
        self._held_back: dict[int, str] = {}  # local GPU -> job whose processes live on
        self.rejected_reports = 0  # reports refused: no valid secret, or implausible
        self._groups: dict[str, WorkerGroup] = {}
        self._reports: dict[tuple[str, int], TelemetryAccumulator] = {}
        self._profile_runs: dict[tuple[str, int], ProfileRun] = {}
        self._server: WorkerServiceServer | None = None
        self._workdir_lock = WorkdirLock(self.workdir)
        self._open_lock = asyncio.Lock()
        self._close_task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def socket_path(self) -> Path | None:
        """The WorkerService socket, once `open()`."""
        return None if self._server is None else self._server.path

    @property
    def isolation_level(self) -> str:
        """What the node registers (`Register.isolation`)."""
        return str(self.isolation.level)

    async def open(self) -> None:
        """Create the work directory, lock it and start WorkerService. Idempotent;
        `start` and `profile` call it, an agent may call it early to fail fast."""
        async with self._open_lock:
            if self._closed:
                raise RuntimeError("TorchBackend: closed")
            if self._server is not None:
                return
            # 0711: jobs pass through to their run folders (`run/`), and see nothing else.
            self.workdir.mkdir(mode=0o711, parents=True, exist_ok=True)
            os.chmod(self.workdir, 0o711)
            (self.workdir / "jobs").mkdir(mode=0o700, exist_ok=True)  # the workers' logs
            os.chmod(self.workdir / "jobs", 0o700)
            self._workdir_lock.acquire()
            if swept := self.isolation.sweep():
                self._log.warning("ended what a previous agent's jobs left running",
                                  cgroups=swept)
            server = WorkerServiceServer(self.workdir, self._on_report)
            try:
                await server.start()
            except BaseException:
                self._workdir_lock.release()
                raise
            self._server = server
        self._log.info("worker service listening", socket=str(server.path),
                       workdir=str(self.workdir), checkpoint_root=str(self.checkpoint_root),
                       gpu_type=self.gpu_type, num_gpus=self.num_gpus,
                       stop_grace_s=self.stop_grace_s, isolation=self.isolation.describe())
        if not self.isolation.isolates:
            self._log.warning("ISOLATION NONE: jobs run as the agent's own user, in its "
                              "cgroup, and can read its files and signal its processes; "
                              "run only your own code on this node")
        if self.emulate:
            self._log.warning(
                "EMULATION: no GPU is used; workers run on the CPU, paced as GPU type "
                f"{self.gpu_type!r}", pace=round(emulation_pace(self.gpu_type), 3),
                cpus=self.cpus)

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
            g.kill()
        for run in self._profile_runs.values():
            run.kill()
        sups = [g.supervisor for g in groups if g.supervisor is not None]
        if sups:
            _, late = await asyncio.wait(sups, timeout=_CLOSE_WAIT_S)
            for t in late:
                t.cancel()
            await asyncio.gather(*sups, return_exceptions=True)
        async with self._open_lock:
            if self._server is not None:
                await self._server.stop()
            self._workdir_lock.release()
        self.isolation.close()
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
        if held := [g for g in gpus if g in self._held_back]:
            raise ValueError(f"local_gpus: GPU {held[0]} is held back: processes of job "
                             f"{self._held_back[held[0]]!r} did not end when killed")
        w = launch.world
        world_size = w.world_size or len(gpus)
        if world_size < w.rank_offset + len(gpus):
            raise ValueError(f"world: world_size {world_size} < rank_offset {w.rank_offset} "
                             f"+ {len(gpus)} local GPUs")
        if not single_node(launch) and not (w.master_addr and w.master_port):
            raise ValueError("world: a multi-node job needs master_addr and master_port")
        if not 0.0 <= launch.restore_progress <= 1.0:
            raise ValueError(f"restore_progress: must be a fraction in [0, 1], got "
                             f"{launch.restore_progress!r}")
        if why := writable_dir(Path(self._checkpoint_dir(launch))):
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
        job, gen = launch.job_id, launch.generation
        space = self._enter(launch.key, launch.spec, f"g{gen}", launch.local_gpus, ckpt)
        gate, token = None, ""
        try:
            gate, token = await self._open_gate(space, job, gen, launch.spec.application,
                                                len(launch.local_gpus))
            log_dir = generation_log_dir(self.workdir, job, gen)
            addr, port = rendezvous(launch)
            common = launch_env(launch, addr, port)
            envs = []
            for i, gpu in enumerate(launch.local_gpus):
                rank = launch.world.rank_offset + i
                envs.append((rank, gpu, self._env(
                    job, gen, gpu, launch.local_gpus, space, token, launch.spec,
                    {**common, "RANK": str(rank), "LOCAL_RANK": str(i)})))
            procs = spawn_ranks(list(launch.spec.command), envs, log_dir,
                                self._affinity.pinned_cpus, space.confinement())
        except BaseException:
            await self._close_space(space, token, gate)
            raise
        accum = TelemetryAccumulator(job, gen, self.gpu_type)
        log = self._log.bind(job_id=job, generation=gen)
        g = WorkerGroup(launch, procs, ckpt, log_dir, accum, log, on_exit,
                        asyncio.get_running_loop().create_future(), self.stop_grace_s,
                        space=space, gate=gate, token=token, leave=self._leave)
        self._groups[job] = g
        self._reports[(job, gen)] = accum
        g.supervisor = asyncio.create_task(g.supervise(self._release),
                                           name=f"nodeagent:torch:{job}")
        log.info("workers started", pids=[p.pid for p in procs], gpus=list(launch.local_gpus),
                 ranks=[p.rank for p in procs], logs=str(log_dir), checkpoint_dir=ckpt,
                 master=f"{addr}:{port}", emulated=self.emulate, isolation=str(space.level),
                 user=None if space.user is None else str(space.user))

    def _release(self, g: WorkerGroup) -> None:
        """The group ended: its GPUs are free (a newer generation may hold the job)."""
        if self._groups.get(g.launch.job_id) is g:
            del self._groups[g.launch.job_id]

    async def stop(self, job_id: str) -> pb.JobExit:
        g = self._groups[job_id]
        g.stopping = g.stop_requested = True
        g.terminate()
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
        if gpu in self._held_back:
            raise ValueError(f"local_gpu: GPU {gpu} is held back: processes of job "
                             f"{self._held_back[gpu]!r} did not end when killed")
        # It always exists for a worker, though a profiling pass must not write to it.
        ckpt = self._job_checkpoint_dir(job_key(request.spec.tenant, job, request.job_uid))
        space = self._enter(job_key(request.spec.tenant, job, request.job_uid), request.spec,
                            f"p{gen}-{gpu}", (gpu,), ckpt)
        run = ProfileRun(TelemetryAccumulator(job, gen, self.gpu_type), log)
        self._profile_runs[key] = run
        token, gate = "", None
        try:
            gate, token = await self._open_gate(space, job, gen, request.spec.application, 1)
            env = self._env(job, gen, gpu, (gpu,), space, token, request.spec,
                            profile_env(request.local_batch_sizes))
            return await run.run(command, env, profile_log_path(self.workdir, job, gen, gpu),
                                 cpus=self._affinity.pinned_cpus(gpu),
                                 timeout_s=self.profile_timeout_s,
                                 sizes=request.local_batch_sizes, confine=space.confinement())
        finally:
            del self._profile_runs[key]
            held = await self._close_space(space, token, gate)
            if held:
                self._hold_back((gpu,), job, space)

    def channel(self, job_id: str) -> tuple[Path, str]:
        """The running generation's gate socket and the secret its workers report with."""
        g = self._groups[job_id]
        return g.space.socket, g.token

    def running(self) -> list[pb.RunningJob]:
        return [pb.RunningJob(job_id=j, generation=g.launch.generation,
                              local_gpus=g.launch.local_gpus) for j, g in self._groups.items()]

    def telemetry(self) -> list[pb.Telemetry]:
        return drain(self._reports, self._groups)

    # -- worker environment -------------------------------------------------------------

    def _job_checkpoint_dir(self, key: str) -> str:
        tenant, _, uid = key.partition("/")
        return str(self.checkpoint_root / safe_name(tenant) / safe_name(uid))

    def _checkpoint_dir(self, launch: Launch) -> str:
        return launch.checkpoint_path or self._job_checkpoint_dir(launch.key)

    def _env(self, job: str, generation: int, gpu: int, job_gpus: Sequence[int], space: Space,
             token: str, spec: pb.JobSpec, extra: Mapping[str, str]) -> dict[str, str]:
        return worker_env(job=job, generation=generation, gpu=gpu, job_gpus=job_gpus,
                          checkpoint_dir=str(space.checkpoint_dir),
                          application=spec.application, gpu_type=self.gpu_type,
                          agent_socket=space.socket, agent_token=token,
                          affinity=self._affinity, base={**self._base_env, **space.env()},
                          own=dict(spec.env), extra=extra)

    # -- isolation ----------------------------------------------------------------------

    def _enter(self, key: str, spec: pb.JobSpec, label: str, gpus: Sequence[int],
               checkpoint_dir: str) -> Space:
        """The space of a run (a generation `g<N>` or a pass `p<N>-<gpu>`) of job `key`;
        ValueError (for the ack) if it cannot be made."""
        devices = () if self.emulate else tuple(self._affinity.device(g) for g in gpus)
        iso = self.isolation
        limits = iso.limits
        if spec.memory_mib_per_gpu:
            # A job may ask for less than the node's share per GPU, never more: the
            # share is what keeps one job from starving the node's others.
            asked = spec.memory_mib_per_gpu << 20
            limits = dataclasses.replace(limits, memory_per_gpu=(
                asked if limits.memory_per_gpu is None else min(asked, limits.memory_per_gpu)))
        try:
            return iso.enter(key, spec.tenant, label, num_gpus=len(gpus), gpus=devices,
                             cpus=self._affinity.job_cpus(gpus),
                             checkpoint_dir=Path(checkpoint_dir), limits=limits)
        except OSError as exc:
            raise ValueError(f"checkpoint directory {checkpoint_dir}: cannot prepare the "
                             f"job's folders: {exc.strerror or exc}") from None

    async def _open_gate(self, space: Space, job: str, gen: int, application: str,
                         num_gpus: int) -> tuple[WorkerGate, str]:
        """The run's gate to WorkerService and the secret its workers report with."""
        assert self._server is not None
        uid = os.geteuid() if space.user is None else space.user.uid
        gid = os.getegid() if space.user is None else space.user.gid
        gate = WorkerGate(space.socket, uid, self._server.path, self._log)
        await gate.start(gid)
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (job, gen, bounds_for(self.gpu_type, application, num_gpus))
        return gate, token

    async def _close_space(self, space: Space, token: str, gate: WorkerGate | None) -> bool:
        """Close the run's gate and end its processes; True if some would not die."""
        self._tokens.pop(token, None)
        if gate is not None:
            await gate.stop()
        return not await self.isolation.leave(space)

    async def _leave(self, g: WorkerGroup) -> tuple[str, bool]:
        """A group's workers have exited: end the rest of its run. (What the exit
        adds, whether its GPUs are free.)"""
        held = await self._close_space(g.space, g.token, g.gate)
        note = memory_note(g.space)
        if held:
            self._hold_back(g.launch.local_gpus, g.launch.job_id, g.space, group=g)
            note = "; ".join(n for n in (note, "processes of the job did not end when "
                                         "killed: its GPUs are held back") if n)
        return note, not held

    def _hold_back(self, gpus: Sequence[int], job: str, space: Space,
                   group: WorkerGroup | None = None) -> None:
        """Processes of a run would not die: its GPUs go to no one until they do. A
        generation's group stays listed as running (the controller places nothing
        there meanwhile) until then."""
        for gpu in gpus:
            self._held_back[gpu] = job
        self._log.error("GPUs held back: processes of the job did not end when killed; "
                        "they go to no other job until they do", job_id=job, gpus=list(gpus))
        asyncio.get_running_loop().create_task(self._retry_release(gpus, space, group))

    async def _retry_release(self, gpus: Sequence[int], space: Space,
                             group: WorkerGroup | None) -> None:
        while not self._closed and not await self.isolation.leave(space):
            await asyncio.sleep(self.held_back_retry_s)
        if self._closed:
            return
        for gpu in gpus:
            self._held_back.pop(gpu, None)
        if group is not None:
            self._release(group)
        self._log.info("held-back GPUs released: the job's processes are gone", gpus=list(gpus))

    # -- WorkerService ------------------------------------------------------------------

    def _on_report(self, report: pb.WorkerReport, token: str) -> pb.WorkerReply:
        """A report counts for the generation whose secret it carries, whatever job
        it names, and only if it is plausible (`plausibility`)."""
        t = report.telemetry
        who = self._tokens.get(token)
        if who is None:
            self.rejected_reports += 1
            self._log.warning("worker report without a valid secret: refused",
                              names_job=t.job_id, names_generation=t.generation)
            return pb.WorkerReply(current=False)
        job, gen, bounds = who
        if (t.job_id, t.generation) != (job, gen):
            self._log.warning("worker report names another job; taken as its sender's",
                              job_id=job, generation=gen, names_job=t.job_id,
                              names_generation=t.generation)
            t.job_id, t.generation = job, gen
        group, run = self._groups.get(job), self._profile_runs.get((job, gen))
        last = run.accum.progress if run is not None else (
            group.accum.progress if group is not None else 0.0)
        if why := check_report(t, last_progress=last, bounds=bounds):
            self.rejected_reports += 1
            self._log.warning("implausible worker report: ignored", job_id=job,
                              generation=gen, why=why)
            return pb.WorkerReply(current=True)
        return on_report(report, group, run, self._log)

