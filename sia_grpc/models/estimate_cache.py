"""One process-wide cache of the batch grids and goodput estimates the policy
computes per job, keyed by content so that it survives pickling.

A job's batch grid (throughput of each candidate batch per configuration) depends on
its throughput estimator's state, its batch bounds and its candidate configurations;
its goodput estimate also on its gradient statistics. Between rounds most jobs
change none of these. The controller, though, ships every job's model to its solver
process each round, pickled: a cache held by the model object would arrive empty
every time (every round cold), so the cache lives here, in the process, and the key
names the estimator by `ThroughputEstimator.uid` and `version`, which pickled copies
keep, instead of by object identity.

Two kinds of entry: a batch grid, keyed by what it depends on, and a goodput
estimate, keyed by its grid's key and the gradient statistics (jobs built from one
profile template share a grid, not their statistics). Bounded by the bytes of their
arrays (a grid row takes ~1.6 KB: NUM_BATCH_SAMPLES batch sizes, four arrays; an
estimate row 40 B) and by rounds unused (see `EstimateCache`). Entries are views
into the arrays one round built for many jobs at once, which all age together."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from sia_grpc.models.goodput import BatchGrid, GoodputEstimate

__all__ = ["Entry", "EstimateCache", "CACHE"]

V = TypeVar("V", bound=BatchGrid | GoodputEstimate | np.ndarray)

# 32,768 GPUs with 20,480 jobs take ~0.5 GB a round (measured: docs/benchmarks.md).
MAX_BYTES = 2 << 30
# Rounds an entry survives unused: a job waiting a few rounds keeps its estimates.
KEEP_ROUNDS = 10


class Entry(Generic[V]):
    """A cached grid, estimate or packed estimate (`bootstrap.evaluate_many`), the
    bytes its arrays take, and the round it was last used in."""

    __slots__ = ("value", "nbytes", "used")

    def __init__(self, value: V) -> None:
        self.value: V = value
        self.nbytes: int = (value.nbytes if isinstance(value, np.ndarray) else
                            sum(getattr(value, f).nbytes
                                for f in type(value).__dataclass_fields__))
        self.used = 0


class EstimateCache:
    """Least-recently-used entries. What bounds them: an entry unused for `keep`
    rounds goes (a finished job's, a candidate set no longer asked about), so a
    long-running controller's solver process holds about its last rounds' working
    set, not an ever-growing history; and `max_bytes` in all, whatever the rounds.
    A round is what `new_round` marks (once per `bootstrap.evaluate_many` call).

    Thread-safe: the policy service may run rounds on several threads at once."""

    def __init__(self, max_bytes: int = MAX_BYTES, keep: int = KEEP_ROUNDS) -> None:
        self.max_bytes = max_bytes
        self.keep = keep
        self._entries: OrderedDict[Hashable, Entry[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._round = 0
        self.nbytes = 0
        # Jobs' estimates that `evaluate_many` found here, and made, since the start.
        self.found = 0
        self.made = 0

    def new_round(self) -> None:
        """Start a round: entries not used in the last `keep` go."""
        with self._lock:
            self._round += 1
            oldest = self._round - self.keep
            while self._entries:
                key, entry = next(iter(self._entries.items()))
                if entry.used >= oldest:
                    break
                del self._entries[key]
                self.nbytes -= entry.nbytes

    def get(self, key: Hashable) -> Entry[Any] | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[Hashable]) -> list[Entry[Any] | None]:
        """`get` of each key (one call for a round's 20,000 jobs)."""
        with self._lock:
            entries, touch, now = self._entries, self._entries.move_to_end, self._round
            found = [entries.get(key) for key in keys]
            for key, entry in zip(keys, found, strict=True):
                if entry is not None:
                    entry.used = now
                    touch(key)
            return found

    def put(self, key: Hashable, entry: Entry[V]) -> Entry[V]:
        with self._lock:
            entry.used = self._round
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._entries[key] = entry
            self.nbytes += entry.nbytes
            while self.nbytes > self.max_bytes and len(self._entries) > 1:
                _, gone = self._entries.popitem(last=False)
                self.nbytes -= gone.nbytes
            return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)


CACHE = EstimateCache()
