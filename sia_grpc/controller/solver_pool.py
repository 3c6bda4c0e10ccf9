"""Running the policy off the event loop: a spawn-context process pool, one
solve at a time, with a deadline.

Spawn, not fork: gRPC and OpenTelemetry hold threads and locks that a forked
child would inherit half-taken. A solve that overruns its deadline cannot be
cancelled inside the worker, so the pool is torn down (its process killed) and
replaced; the caller keeps the previous allocation for that round.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import multiprocessing
from collections.abc import Mapping, Sequence

from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.params import PolicySpec
from sia_grpc.policy.types import JobAllocation, Policy, PolicyJob, RoundResult


@functools.lru_cache(maxsize=4)
def built(spec: PolicySpec) -> Policy:
    """The policy `spec` describes, built once per worker process."""
    return spec.build()


def solve_round(spec: PolicySpec, cluster: Cluster, jobs: Sequence[PolicyJob],
                previous: Mapping[str, JobAllocation]) -> RoundResult:
    """One round of the policy (runs in the worker process)."""
    return built(spec).optimize(cluster, list(jobs), dict(previous))


class SolverPool:
    def __init__(self, spec: PolicySpec, *, inline: bool = False) -> None:
        """Rounds of the policy `spec` describes (built in the worker, from name,
        settings and round length). `inline=True` solves on a thread of this
        process (tests, tiny setups)."""
        self.spec = spec
        self._inline = inline
        self._pool: concurrent.futures.Executor | None = None

    def _executor(self) -> concurrent.futures.Executor:
        if self._pool is None:
            if self._inline:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "sia-solve")
            else:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def warm(self) -> Policy:
        """Start the worker and build the policy there, before the first round needs
        it; returns that policy (a copy), the very object the rounds run."""
        return await asyncio.get_running_loop().run_in_executor(self._executor(), built,
                                                                self.spec)

    async def solve(self, cluster: Cluster, jobs: Sequence[PolicyJob],
                    previous: Mapping[str, JobAllocation], *, timeout: float) -> RoundResult:
        """The round's result; raises TimeoutError (pool replaced) or the solve's error."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor(), solve_round, self.spec, cluster, jobs,
                                   previous)
        try:
            return await asyncio.wait_for(fut, timeout)
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
        if isinstance(pool, concurrent.futures.ProcessPoolExecutor):
            # No public way to stop a running task: end the worker process itself.
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
