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

A round's jobs are shipped pickled, but each job's throughput estimator (its
profiles and observations: most of a job's bytes, and most of the time spent
pickling and unpickling 1,000 jobs, about 260 ms of a round) goes by reference,
`(uid, version)`, where the worker holds it from the last round: those two name
the estimator's data (`ThroughputEstimator.uid`). One that has changed since (a
running job reports step times between rounds) goes as its changes since the
version the worker holds, which the worker replays onto its copy
(`ThroughputEstimator.replay`: the same data to the bit). A worker that does not
hold one (a new process) says so, and the round is shipped again in full.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import multiprocessing
import pickle
import signal
import time
from collections.abc import Iterator, Mapping, Sequence

from sia_grpc.api import pb
from sia_grpc.api.convert import queues_from_pb, queues_to_pb
from sia_grpc.models.bootstrap import ThroughputEstimator
from sia_grpc.policy.cluster import Cluster
from sia_grpc.policy.gcpause import collection_paused
from sia_grpc.policy.params import PolicySpec
from sia_grpc.policy.queues import QueueSet
from sia_grpc.policy.types import (
    JobAllocation,
    Policy,
    PolicyJob,
    RoundResult,
    WarmStart,
    warm_arg,
)


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
    policy = built(spec)
    return policy.optimize(
        cluster, list(jobs), dict(previous),
        queues=None if queues is None else queues_from_pb(pb.QueueConfig.FromString(queues)),
        **warm_arg(policy, warm))


EstimatorKey = tuple[int, int]  # (uid, version)
# In the worker: the estimators of the last round it received, by key.
_HELD: dict[EstimatorKey, ThroughputEstimator] = {}


class _NotHeld(Exception):
    """The payload names an estimator this worker does not hold."""


class _Shipping(pickle.Pickler):
    """Pickles a round, each estimator in `held` by reference, one the worker holds
    at an earlier version as the changes since (`ThroughputEstimator.changes_since`);
    `keys` collects every estimator's key (what the worker holds once it has the
    round). (`reducer_override`, not `persistent_id`: the pickler calls that for every
    object, each float and string of a round's jobs; this one skips the plain types,
    ~2× faster on 1,000 jobs.)"""

    def __init__(self, file: io.BytesIO, held: frozenset[EstimatorKey]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.held, self.keys = set(held), set[EstimatorKey]()
        self.versions = dict(held)  # uid -> the version the worker holds

    def reducer_override(self, obj: object):
        if type(obj) is not ThroughputEstimator:
            return NotImplemented
        key = (obj.uid, obj.version)
        self.keys.add(key)
        if key in self.held:
            return _held, key
        was = self.versions.get(obj.uid)
        changes = None if was is None or was > obj.version else obj.changes_since(was)
        if changes is None:
            return NotImplemented
        self.held.add(key)  # (once brought up to date there, it goes by reference)
        return _brought_up, (obj.uid, was, obj.version, changes)


def _held(uid: int, version: int) -> ThroughputEstimator:
    """(In the worker, unpickling) the estimator it holds at that key; _NotHeld if none."""
    key = (uid, version)
    est = _HELD.get(key)
    if est is None or (est.uid, est.version) != key:  # (changed here since: not it)
        raise _NotHeld(key)
    return est


def _brought_up(uid: int, was: int, version: int, changes) -> ThroughputEstimator:
    """(In the worker) the estimator it holds at (uid, was), its changes replayed."""
    est = _held(uid, was)
    try:
        est.replay(changes, version)
    except ValueError:
        raise _NotHeld((uid, was)) from None
    _HELD[(uid, version)] = est
    return est


class _Receiving(pickle.Unpickler):
    """(The default unpickler: `_held` and `_brought_up` find the estimators.)"""


def ship(cluster: Cluster, jobs: Sequence[PolicyJob], previous: Mapping[str, JobAllocation],
         held: frozenset[EstimatorKey]) -> tuple[bytes, frozenset[EstimatorKey]]:
    """The round pickled for a worker holding `held`, and the estimators it names."""
    f = io.BytesIO()
    shipping = _Shipping(f, held)
    shipping.dump((cluster, list(jobs), dict(previous)))
    return f.getvalue(), frozenset(shipping.keys)


@collection_paused
def solve_shipped(spec: PolicySpec, payload: bytes, queues: bytes | None = None,
                  warm: WarmStart | None = None) -> RoundResult | None:
    """`solve_round` of a shipped round (in the worker process); None, solving
    nothing, where the payload names an estimator this worker does not hold.

    The collector is paused from the unpickling on, not only in the policy: the
    round's ~100,000 new objects (1,000 jobs) in a worker still holding the last
    round's set off full collections while they were unpickled, 60 → 200-340 ms
    (measured in the 1,000-agent bench's worker)."""
    try:
        cluster, jobs, previous = _Receiving(io.BytesIO(payload)).load()
    except _NotHeld:
        return None
    held = {}
    for j in jobs:
        est = getattr(j.model, "estimator", None)
        if type(est) is ThroughputEstimator:
            held[(est.uid, est.version)] = est
    _HELD.clear()
    _HELD.update(held)  # (this round's only: the next names no others it can use)
    return solve_round(spec, cluster, jobs, previous, queues, warm)


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
        # The estimators the worker holds (the last round's it received): shipped by
        # reference. Only a speed-up: a worker without them asks for the round again.
        self._held: frozenset[EstimatorKey] = frozenset()
        self.shipped_bytes = 0  # the last round's payload

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
        queue_bytes = None if queues is None else queues_to_pb(queues).SerializeToString()
        deadline = time.monotonic() + timeout
        try:
            if self._inline:  # (a thread of this process: nothing to ship)
                result = await asyncio.wait_for(self._submit(
                    solve_round, self.spec, cluster, jobs, previous, queue_bytes, self._warm),
                    timeout)
            else:
                result = None
                for held in (self._held, frozenset()):  # (again in full if it had lost them)
                    payload, keys = await asyncio.to_thread(ship, cluster, jobs, previous, held)
                    self.shipped_bytes = len(payload)
                    result = await asyncio.wait_for(self._submit(
                        solve_shipped, self.spec, payload, queue_bytes, self._warm),
                        max(deadline - time.monotonic(), 0.0))
                    if result is not None:
                        self._held = keys
                        break
                assert result is not None  # (a round shipped in full names nothing held)
            self._warm = result.warm
            return result
        except TimeoutError:
            self._kill()
            raise
        except concurrent.futures.BrokenExecutor:
            self._kill()
            raise

    def _kill(self) -> None:
        self._held = frozenset()  # (a new worker holds nothing)
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
        self._held = frozenset()
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
