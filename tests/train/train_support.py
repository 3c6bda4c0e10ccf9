"""Helpers for the training-library tests: launching workers with the agent's
environment contract, reading what they trained on, and a fake agent."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from sia_grpc.api import WorkerServiceServicer, add_WorkerServiceServicer_to_server, pb
from sia_grpc.testing.ports import free_port

SCRIPT = Path(__file__).with_name("worker_script.py")


def clean_environ() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIA_", "TEST_")) and k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    return env


class Workers:
    """One generation's worker processes (ranks 0..world-1) of one job."""

    def __init__(self, tmp: Path, generation: int, world: int, *, script: Path = SCRIPT,
                 args: tuple[str, ...] = (), **env: object) -> None:
        self.log_dir = tmp
        port = free_port()  # torch's rendezvous: named before the workers start
        base = clean_environ()
        base.update({
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "SIA_JOB_ID": "job-1",
            "SIA_GENERATION": str(generation), "SIA_GPU_TYPE": "cpu-test",
            "SIA_CHECKPOINT_DIR": str(tmp / "ckpt"), "TEST_LOG_DIR": str(tmp),
        })
        base.update({k: str(v) for k, v in env.items()})
        self.procs = []
        for rank in range(world):
            e = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            out = open(tmp / f"gen{generation}-rank{rank}.out", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(
                [sys.executable, str(script), *args], env=e, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            out.close()
        self.generation = generation

    def signal(self, sig: int = signal.SIGTERM) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        try:
            for p in self.procs:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"workers did not exit in {timeout} s:\n{self.output()}") from None
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def output(self) -> str:
        parts = []
        for r in range(len(self.procs)):
            text = (self.log_dir / f"gen{self.generation}-rank{r}.out").read_text(errors="replace")
            parts.append(f"--- rank {r} ---\n{text[-3000:]}")
        return "\n".join(parts)


def read_log(tmp: Path, generation: int | None = None, rank: int | None = None) -> list[dict]:
    rows = []
    for p in sorted(tmp.glob("gen*-rank*.jsonl")):
        g, r = (int(x) for x in p.stem[3:].split("-rank"))
        if (generation is None or g == generation) and (rank is None or r == rank):
            for line in p.read_text().splitlines():
                if line.strip():
                    rows.append(dict(json.loads(line), gen=g, rank=r))
    return rows


def wait_until(cond: Callable[[], bool], timeout: float, what: str, workers: Workers) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            workers.kill()
            raise AssertionError(f"timed out waiting for {what}:\n{workers.output()}")
        if any(p.poll() is not None for p in workers.procs):
            raise AssertionError(f"a worker exited while waiting for {what}:\n"
                                 f"{workers.output()}")
        time.sleep(0.01)


def epoch_indices(rows: list[dict]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r["epoch"], []).extend(r["idx"])
    return out


class FakeAgent(WorkerServiceServicer):
    """The agent's WorkerService on a Unix socket; `reply(report) -> WorkerReply`."""

    def __init__(self, reply: Callable[[pb.WorkerReport], pb.WorkerReply] | None = None) -> None:
        self.reports: list[pb.WorkerReport] = []
        self.lock = threading.Lock()
        self._reply = reply or (lambda r: pb.WorkerReply(current=True))
        self._dir = tempfile.mkdtemp(prefix="sia-t-", dir="/tmp")  # short: sun_path limit
        self.path = os.path.join(self._dir, "agent.sock")
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add_WorkerServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.path}")

    def Report(self, request, context):  # noqa: N802 (the generated name)
        with self.lock:
            self.reports.append(request)
            return self._reply(request)

    def __enter__(self) -> FakeAgent:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(None).wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)
