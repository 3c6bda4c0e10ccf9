"""Running the policy off the event loop: a spawn-context process pool, one
solve at a time, with a deadline.

Spawn, not fork: gRPC and OpenTelemetry hold threads and locks that a forked
child would inherit half-taken. A solve that overruns its deadline cannot be
cancelled inside the worker, so the pool is torn down (its process killed) and
replaced; the caller keeps the previous allocation for that round.

The worker ignores SIGINT and SIGTERM: Ctrl-C in a terminal (or systemd's stop)
signals the whole process group, and the controller, not the signal, ends its
solver. Ignored from its first instruction on: the signals are blocked in the
thread that spawns it (a child inherits the mask), and the worker's initializer
sets them to SIG_IGN before unblocking them, so none is seen during its imports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import multiprocessing
import signal
from collections.abc import Iterator, Mapping, Sequence

from sia_grpc.api import pb
from sia_grpc.api.convert import queues_from_pb, queues_to_pb
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.params import PolicySpec
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import JobAllocation, Policy, PolicyJob, RoundResult, WarmStart


@functools.lru_cache(maxsize=4)
def built(spec: PolicySpec) -> Policy:
    """The policy `spec` describes, built once per worker process."""
    return spec.build()


def solve_round(spec: PolicySpec, cluster: Cluster, jobs: Sequence[PolicyJob],
                previous: Mapping[str, JobAllocation],
                queues: bytes | None = None, warm: WarmStart | None = None) -> RoundResult:
    """One round of the policy (runs in the worker process). The queues come as a
    serialized QueueConfig: a QueueSet's read-only mappings do not pickle, and neither
    does a generated message (its module is not importable under its proto name)."""
    return built(spec).optimize(
        cluster, list(jobs), dict(previous),
        queues=None if queues is None else queues_from_pb(pb.QueueConfig.FromString(queues)),
        **({} if warm is None else {"warm": warm}))  # (a policy without one need not take it)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore_stop_signals() -> None:
    """The worker's initializer: the parent shuts it down, signals do not."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    """Block SIGINT/SIGTERM in this thread while a worker may be spawned from it; one
    that arrives meanwhile stays pending and is delivered when unblocked."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class SolverPool:
    def __init__(self, spec: PolicySpec, *, inline: bool = False) -> None:
        """Rounds of the policy `spec` describes (built in the worker, from name,
        settings and round length). `inline=True` solves on a thread of this
        process (tests, tiny setups)."""
        self.spec = spec
        self._inline = inline
        self._pool: concurrent.futures.Executor | None = None
        # The last round's warm start for the next (it only makes a round faster).
        self._warm: WarmStart | None = None

    def _executor(self) -> concurrent.futures.Executor:
        if self._pool is None:
            if self._inline:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "sia-solve")
            else:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_ignore_stop_signals)
        return self._pool

    def _submit(self, fn, *args) -> asyncio.Future:
        # A process pool spawns its worker inside submit, so from this thread.
        with _stop_signals_blocked():
            return asyncio.get_running_loop().run_in_executor(self._executor(), fn, *args)

    async def warm(self) -> Policy:
        """Start the worker and build the policy there, before the first round needs
        it; returns that policy (a copy), the very object the rounds run."""
        return await self._submit(built, self.spec)

    async def solve(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                    previous: Mapping[str, JobAllocation], *, timeout: float,
                    queues: QueueSet | None = None) -> RoundResult:
        """The round's result; raises TimeoutError (pool replaced) or the solve's error."""
        fut = self._submit(solve_round, self.spec, cluster, jobs, previous,
                           None if queues is None else queues_to_pb(queues).SerializeToString(),
                           self._warm)
        try:
            result = await asyncio.wait_for(fut, timeout)
            self._warm = result.warm
            return result
        except TimeoutError:
            self._kill()
            raise
        except concurrent.futures.BrokenExecutor:
            self._kill()
            raise

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # No public way to stop a running task: end the worker process itself.
        for proc in _workers(pool):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self, timeout: float = 2.0) -> None:
        """Shut the worker down; one still solving after `timeout` s is killed (it
        ignores the signals that would otherwise have ended it)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = _workers(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
        pool.shutdown(wait=True)  # its manager thread, now that the worker is gone


def _workers(pool: concurrent.futures.Executor) -> list:
    """A process pool's worker processes (none for a thread pool)."""
    return list((getattr(pool, "_processes", None) or {}).values())
