"""The modeled work of `sia bench slurm`, computed in the bench's own process and
served to its workers (`sia_grpc.bench.slurm_worker`) over loopback HTTP.

A modeled worker follows the emulation's ground truth (`Trajectory.plan` over
`AppTruth`, what the simulator and the node agents' modeled workers run), which
needs numpy, the profiles and the policy's models: a second or more of imports on
this machine, paid on every start and every move, and held on the job's GPUs in
real time, so 360 modeled seconds each at the bench's time scale: the emulation's
cost, not the bridge's, and many times the application's restore delay. Here the
bench's process, which has them loaded already, plans each copy's trajectory and
sends its reports to the bridge (real gRPC, `sia_grpc.train`'s `AgentClient` to
the job's `SIA_AGENT_ADDRESS` with its token); the worker itself imports only the
standard library.

    POST /plan      {"application", "progress", "shape": {...}, "slurm_job_id", "launched_at",
                    "main_at"}  -> {"plan", "restart_delay", "duration", "iteration_time",
                    "max_progress", "gpu_type", "allocation"}
    POST /progress  {"plan", "trained_s", "stopped_at"}           -> {"progress"}
    POST /report    {"plan", "trained_s", "job_id", "generation", "address", "token"}
                    -> {} or {"batch": {"atomic_batch_size", "accum_steps"}} (the
                    bridge's reply changed the batch: the worker re-plans)
    POST /rebatch   {"plan", "trained_s", "atomic_batch_size", "accum_steps"}
                    -> /plan's answer for the rest, on the same GPUs, restore 0

A shape is the bridge's (`{"gpu_type", "num_nodes", "num_replicas",
"atomic_batch_size", "accum_steps"}`, from `sia-slurm env`) or Slurm alone's
(`{"batch_size", "gpus", "gres_type"}`: its node's type, the fixed batch split over
the GPUs as the policies split one).

Each copy's moments (the time.time() clock: when Slurm started its batch script,
when its Python got to the worker, when it was ready, its first report, the SIGTERM
and its exit) are kept by its Slurm job id (`copies()`), for the bench's breakdown
of where a move's seconds go (`sia_grpc.bench.slurm_stages`).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sia_grpc.api import pb
from sia_grpc.emulation import AppTruth, load_app
from sia_grpc.models.goodput import split_local_batch
from sia_grpc.nodeagent.gpus import gpu_type_for
from sia_grpc.nodeagent.modeled import Trajectory
from sia_grpc.train.telemetry import AgentClient

__all__ = ["TruthServer"]


@dataclass(frozen=True)
class _Plan:
    app: AppTruth
    gpu_type: str
    alloc: pb.Allocation
    path: Trajectory
    copy: str = ""  # its Slurm job id ("": not told)


def _allocation(app: AppTruth, shape: Mapping[str, Any]) -> tuple[str, pb.Allocation]:
    """(profile GPU type, allocation) of a worker's shape (module docstring)."""
    if "batch_size" not in shape:
        return str(shape["gpu_type"]), pb.Allocation(
            num_nodes=int(shape["num_nodes"]), num_replicas=int(shape["num_replicas"]),
            atomic_batch_size=int(shape["atomic_batch_size"]),
            accum_steps=int(shape.get("accum_steps", 0)))
    gpu_type, gpus = gpu_type_for(str(shape["gres_type"])), int(shape["gpus"])
    atomic, accum = split_local_batch(int(shape["batch_size"]) / gpus,
                                      app.local_bsz_limits(gpu_type)[1])
    return gpu_type, pb.Allocation(num_nodes=1, num_replicas=gpus,
                                   atomic_batch_size=int(atomic), accum_steps=int(accum))


class TruthServer:
    """The service above on 127.0.0.1 (`address`); `stop()` ends it."""

    def __init__(self) -> None:
        self._plans: dict[int, _Plan] = {}
        self._ids = itertools.count(1)
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self._copies: dict[str, dict[str, float]] = {}  # Slurm job id -> moment -> time
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.address = f"127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True,
                                        name="slurm-truth")
        self._thread.start()

    def plan(self, req: Mapping[str, Any]) -> dict[str, Any]:
        app = load_app(str(req["application"]))
        gpu_type, alloc = _allocation(app, req["shape"])
        copy = str(req.get("slurm_job_id") or "")
        out = self._new_plan(app, gpu_type, alloc, float(req["progress"]), copy)
        self._note(copy, launched=req.get("launched_at"), main=req.get("main_at"),
                   ready=time.time(), gpus=alloc.num_replicas,
                   progress_from=float(req["progress"]))
        return {**out, "restart_delay": app.restart_delay}

    def rebatch(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """The rest of plan `plan` (`trained_s` into it) with the atomic batch and
        accumulation steps the bridge replied with, on the same GPUs: no restore."""
        p = self._plan(req)
        alloc = pb.Allocation()
        alloc.CopyFrom(p.alloc)
        alloc.atomic_batch_size, alloc.accum_steps = (int(req["atomic_batch_size"]),
                                                      int(req["accum_steps"]))
        progress = p.path.progress(float(req["trained_s"]))
        return {**self._new_plan(p.app, p.gpu_type, alloc, progress, p.copy),
                "restart_delay": 0.0}

    def _new_plan(self, app: AppTruth, gpu_type: str, alloc: pb.Allocation, progress: float,
                  copy: str) -> dict[str, Any]:
        path = Trajectory.plan(app, gpu_type, alloc, progress)
        with self._lock:
            plan_id = next(self._ids)
            self._plans[plan_id] = _Plan(app, gpu_type, alloc, path, copy)
        return {"plan": plan_id,
                "duration": path.duration, "iteration_time": path.iteration_time,
                "max_progress": app.max_progress, "gpu_type": gpu_type,
                "allocation": {"num_nodes": alloc.num_nodes, "num_replicas": alloc.num_replicas,
                               "atomic_batch_size": alloc.atomic_batch_size,
                               "accum_steps": alloc.accum_steps}}

    def progress(self, req: Mapping[str, Any]) -> dict[str, Any]:
        p = self._plan(req)
        done = p.path.progress(float(req["trained_s"]))
        self._note(p.copy, stopped=req.get("stopped_at"), exited=time.time(), progress_to=done)
        return {"progress": done}

    def copies(self) -> dict[str, dict[str, float]]:
        """Slurm job id -> its copy's moments (module docstring): launched, main,
        ready, first_report, stopped (SIGTERM), exited; and its GPUs (`gpus`) and the
        progress it started from and got to (`progress_from`, `progress_to`)."""
        with self._lock:
            return {k: dict(v) for k, v in self._copies.items()}

    def gpu_hours(self, scale: float) -> tuple[float, float]:
        """(modeled GPU-hours all copies' workers ran, those of copies that made no
        progress): each copy from its batch script's start to its worker's exit, on
        its GPUs, `scale` modeled seconds a second."""
        total = idle = 0.0
        for c in self.copies().values():
            if "launched" not in c or "exited" not in c:
                continue
            held = max(c["exited"] - c["launched"], 0.0) * c.get("gpus", 0) * scale / 3600
            total += held
            if c.get("progress_to", 0.0) <= c.get("progress_from", 0.0):
                idle += held
        return total, idle

    def _note(self, copy: str, **moments: Any) -> None:
        """Keep the copy's first time for each moment given (None: not known)."""
        if not copy:
            return
        with self._lock:
            seen = self._copies.setdefault(copy, {})
            for name, t in moments.items():
                if t is not None and name not in seen:
                    seen[name] = float(t)

    def report(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """A `WorkerReport` as `sia_grpc.train`'s rank 0 sends it: the shape's step
        times and the gradient statistics where the job has got to."""
        p = self._plan(req)
        trained = float(req["trained_s"])
        progress = p.path.progress(trained)
        batch = p.alloc.num_replicas * p.alloc.atomic_batch_size * (p.alloc.accum_steps + 1)
        grad = p.app.grad_params(progress, batch)
        t = pb.Telemetry(job_id=str(req["job_id"]), generation=int(req["generation"]),
                         progress=progress / p.app.max_progress,
                         grad=pb.GradientStats(sqr=grad.sqr, var=grad.var))
        t.samples.append(pb.ThroughputSample(
            gpu_type=p.gpu_type, num_nodes=p.alloc.num_nodes,
            num_replicas=p.alloc.num_replicas, atomic_batch_size=p.alloc.atomic_batch_size,
            accum_steps=p.alloc.accum_steps, step_time_s=p.path.step_time,
            sync_time_s=p.path.sync_time,
            count=max(int(trained / p.path.iteration_time), 1)))
        reply = self._client(str(req["address"]), str(req.get("token", ""))).report(
            pb.WorkerReport(telemetry=t), force=True)
        self._note(p.copy, first_report=time.time())
        if reply is None or not reply.atomic_batch_size or (
                reply.atomic_batch_size, reply.accum_steps) == (p.alloc.atomic_batch_size,
                                                                p.alloc.accum_steps):
            return {}
        return {"batch": {"atomic_batch_size": reply.atomic_batch_size,
                          "accum_steps": reply.accum_steps}}  # (the bridge changed it)

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    def _plan(self, req: Mapping[str, Any]) -> _Plan:
        with self._lock:
            return self._plans[int(req["plan"])]

    def _client(self, address: str, token: str) -> AgentClient:
        with self._lock:
            client = self._clients.get((address, token))
            if client is None:
                client = self._clients[(address, token)] = AgentClient(address=address,
                                                                       token=token)
            return client


def _handler(server: TruthServer) -> type[BaseHTTPRequestHandler]:
    routes = {"/plan": server.plan, "/progress": server.progress, "/report": server.report,
              "/rebatch": server.rebatch}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            route = routes.get(self.path)
            try:
                if route is None:
                    raise KeyError(self.path)
                body = route(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                data, code = json.dumps(body).encode(), 200
            except (KeyError, ValueError, TypeError) as err:
                data, code = json.dumps({"error": repr(err)}).encode(), 400
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_) -> None:  # (one line per request on stderr otherwise)
            pass

    return Handler
