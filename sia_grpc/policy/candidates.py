"""Which configurations each job may take this round, and what each is worth.

Shared by every policy: the scaling rules (start at the minimum, at most 2× per
round), the per-job bounds (allowed types, min/max GPUs, hybrid-parallel replica
size, rigid counts), and the goodput estimate of each candidate.

A round's candidates are one flat, job-major table (`CandidateTable`) rather than
a list per job: at 8,192 GPUs and 5,000 jobs there are ~50,000 candidates, and
every step after estimation (normalising, restart factors, the ILP's arrays) is
then one numpy expression instead of 5,000 small ones.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from sia_grpc.models.bootstrap import JobGoodputModel, evaluate_jobs
from sia_grpc.policy.cluster import Cluster, Config
from sia_grpc.policy.types import Adaptivity, JobAllocation, PolicyJob

_FIELDS = ("goodput", "batch_size", "atomic_bsz", "accum_steps")


@dataclass(frozen=True, eq=False)
class CandidateTable:
    """All jobs' candidates for one round; rows of job i are `offsets[i]:offsets[i+1]`,
    in ascending configuration index (so grouped by GPU type)."""

    cluster: Cluster
    offsets: np.ndarray  # int64[num_jobs + 1]
    config: npt.NDArray[np.int64]  # [n]: index into cluster.configs
    replicas: np.ndarray  # data-parallel replicas
    goodput: np.ndarray  # samples/s × efficiency (throughput for fixed-batch jobs)
    batch_size: np.ndarray
    atomic_bsz: np.ndarray
    accum_steps: np.ndarray

    @property
    def num_jobs(self) -> int:
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return len(self.config)

    @property
    def job(self) -> np.ndarray:
        """Job index of each row."""
        return np.repeat(np.arange(self.num_jobs), np.diff(self.offsets))

    def count(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def config_of(self, row: int) -> Config:
        return self.cluster.configs[int(self.config[row])]

    def gpus(self) -> np.ndarray:
        return self.cluster.config_arrays[0][self.config]

    def types(self) -> np.ndarray:
        return self.cluster.config_arrays[1][self.config]

    def where(self, keep: np.ndarray) -> CandidateTable:
        """The rows where `keep` holds (offsets recomputed)."""
        counts = np.bincount(self.job[keep], minlength=self.num_jobs)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return CandidateTable(self.cluster, offsets, self.config[keep], self.replicas[keep],
                              self.goodput[keep], self.batch_size[keep], self.atomic_bsz[keep],
                              self.accum_steps[keep])

    def per_job_reduce(self, ufunc: np.ufunc, values: np.ndarray, empty: float) -> np.ndarray:
        """`ufunc.reduce` of `values` over each job's rows (`empty` for jobs with none)."""
        out = np.full(self.num_jobs, empty, dtype=float)
        has = np.diff(self.offsets) > 0
        if np.any(has):
            out[has] = ufunc.reduceat(values, self.offsets[:-1][has])
        return out


def count_bounds(cluster: Cluster, jobs: Sequence[PolicyJob],
                 current: Sequence[Config | None], *, max_scale_up: float = 2.0,
                 scale_rules: bool = True, start_scale: float = 1.0) -> np.ndarray:
    """Per job (lo, hi, limit), shape (jobs, 3): the job may take the counts in
    [lo, hi] on a type; a type with no count there offers instead its first
    count ≥ lo, if that is ≤ limit.

    A rigid job takes its own count (on a type without that count, the next one
    up: it still runs its own replicas there). With `scale_rules`, a job not yet
    running starts at its minimum (at most `start_scale` times it) and a running
    one may at most multiply its count by `max_scale_up`; `limit` is its `max_gpus`.
    Vectorised: one pass reads the jobs' fields, numpy does the rest (the same
    integer arithmetic as per job: `int(x)` of a positive float is its floor).
    """
    unbounded = cluster.total_gpus
    rigid_ = Adaptivity.RIGID
    cols = np.array([(j.adaptivity is rigid_, j.num_gpus or 0, j.pipeline_gpus, j.min_gpus,
                      unbounded if j.max_gpus is None else j.max_gpus,
                      -1 if c is None else c.num_gpus)
                     for j, c in zip(jobs, current, strict=True)],
                    dtype=np.int64).reshape(-1, 6)
    rigid, num, pipeline, min_gpus, limit, cur = cols.T
    lo = np.maximum(min_gpus, pipeline)
    hi = limit
    if scale_rules:
        start = np.maximum((lo * start_scale).astype(np.int64), lo)
        grow = np.maximum((cur * max_scale_up).astype(np.int64), lo)
        hi = np.minimum(hi, np.where(cur < 0, start, grow))
    own = np.maximum(num, pipeline)
    rigid = rigid.astype(bool)
    return np.stack([np.where(rigid, own, lo), np.where(rigid, own, hi),
                     np.where(rigid, unbounded, limit)], axis=1)


def candidate_index(cluster: Cluster, jobs: Sequence[PolicyJob],
                    current: Sequence[Config | None], *, max_scale_up: float = 2.0,
                    scale_rules: bool = True,
                    start_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Every job's candidate configurations as (offsets, indices into
    cluster.configs), job-major and ascending within a job.

    Vectorised over jobs: within a type the configuration set is sorted by GPU
    count, so each job's candidates of a type are one contiguous range.
    """
    bounds = count_bounds(cluster, jobs, current, max_scale_up=max_scale_up,
                          scale_rules=scale_rules, start_scale=start_scale)
    gpus = cluster.config_arrays[0]
    num_types = len(cluster.gpu_types)
    starts = np.zeros((len(jobs), num_types), dtype=np.int64)
    ends = np.zeros_like(starts)
    for t, (a, b) in enumerate(cluster.type_ranges):
        s = a + np.searchsorted(gpus[a:b], bounds[:, 0], side="left")
        e = a + np.searchsorted(gpus[a:b], bounds[:, 1], side="right")
        # No count of this type in [lo, hi]: its first count ≥ lo, within the limit.
        up = (e <= s) & (s < b) & (gpus[np.minimum(s, b - 1)] <= bounds[:, 2])
        starts[:, t], ends[:, t] = s, np.where(up, s + 1, e)
    for i, job in enumerate(jobs):
        if job.allowed_types is not None:
            for t, name in enumerate(cluster.gpu_types):
                if name not in job.allowed_types:
                    ends[i, t] = starts[i, t]
    counts = np.maximum(ends - starts, 0).ravel()
    # Concatenate the ranges: row k of range r is starts[r] + k.
    first_row = np.cumsum(counts) - counts
    index = np.repeat(starts.ravel() - first_row, counts) + np.arange(counts.sum())
    per_job = counts.reshape(len(jobs), num_types).sum(axis=1)
    pipeline = np.array([j.pipeline_gpus for j in jobs], dtype=np.int64)
    if np.any(pipeline > 1):  # hybrid-parallel jobs take whole replicas only
        owner = np.repeat(np.arange(len(jobs)), per_job)
        keep = gpus[index] % pipeline[owner] == 0
        index = index[keep]
        per_job = np.bincount(owner[keep], minlength=len(jobs))
    offsets = np.concatenate([[0], np.cumsum(per_job)]).astype(np.int64)
    return offsets, index.astype(np.int64)


def build_candidates(cluster: Cluster, jobs: Sequence[PolicyJob],
                     previous: Mapping[str, JobAllocation], *, max_scale_up: float = 2.0,
                     scale_rules: bool = True, start_scale: float = 1.0,
                     type_maps: Sequence[Mapping[str, str] | None] | None = None,
                     ) -> CandidateTable:
    """Every job's candidates with their goodput estimates.

    `type_maps[i]` lets a heterogeneity-unaware policy evaluate every type as if
    it were another (Pollux's view of the cluster). Candidates whose estimate is
    zero (type not profiled, batch infeasible) are dropped.
    """
    get = previous.get
    current = [None if (a := get(j.job_id)) is None else a.config for j in jobs]
    offsets, index = candidate_index(cluster, jobs, current, max_scale_up=max_scale_up,
                                     scale_rules=scale_rules, start_scale=start_scale)
    return estimate(cluster, jobs, offsets, index, type_maps)


def estimate(cluster: Cluster, jobs: Sequence[PolicyJob], offsets: np.ndarray,
             config: np.ndarray,
             type_maps: Sequence[Mapping[str, str] | None] | None = None) -> CandidateTable:
    """Goodput of job i's configurations `config[offsets[i]:offsets[i+1]]`
    (indices into cluster.configs).

    Adaptive jobs whose model offers batch grids (`JobGoodputModel`) are scored
    in one batched pass (`models.evaluate_jobs`), others by one `evaluate` call
    per GPU type.
    """
    gpus_of, types_of, nodes_of = cluster.config_arrays
    counts = np.diff(offsets)
    n = len(config)
    replicas = _replicas(jobs, gpus_of[config], counts)
    nodes = nodes_of[config]
    out = {f: np.zeros(n) for f in _FIELDS}
    # Plain Python lists and slices below: this loop runs once per job, 20,000 a round.
    type_codes = types_of[config]
    codes, gpu_types = type_codes.tolist(), cluster.gpu_types

    def type_names(a: int, b: int) -> tuple[str, ...]:  # (only where a job needs them)
        return tuple(gpu_types[t] for t in codes[a:b])

    batched = _Batched()
    _evaluate_each(cluster, jobs, offsets.tolist(), type_codes, nodes, replicas, type_maps,
                   type_names, out, batched)

    def rows_of(k: int) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        a, b, mapped = batched.spans[k]
        return mapped or type_names(a, b), nodes[a:b], replicas[a:b]

    est = evaluate_jobs(batched.models, batched.row_keys, rows_of)
    batched_rows = np.repeat(batched.jobs, counts)
    for f, arr in out.items():
        arr[batched_rows] = getattr(est, f)
    table = CandidateTable(cluster, offsets, config, replicas, out["goodput"],
                           out["batch_size"].astype(np.int64), out["atomic_bsz"].astype(np.int64),
                           out["accum_steps"].astype(np.int64))
    return table.where(np.isfinite(table.goodput) & (table.goodput > 0))


def _replicas(jobs: Sequence[PolicyJob], gpus: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Data-parallel replicas of each row (`gpus`: its GPU count; `counts`: rows per job)."""
    pipeline = np.repeat(np.array([j.pipeline_gpus for j in jobs], dtype=np.int64), counts)
    replicas = gpus // np.maximum(pipeline, 1)
    # A rigid count rounded up to the configuration set still runs its own count.
    unbounded = np.iinfo(np.int64).max
    # (a rigid job's num_gpus is set: PolicyJob checks it)
    rigid_reps = np.repeat(np.array([cast(int, j.num_gpus) // j.pipeline_gpus
                                     if j.adaptivity is Adaptivity.RIGID else unbounded
                                     for j in jobs], dtype=np.int64), counts)
    capped: npt.NDArray[np.int64] = np.minimum(replicas, rigid_reps)
    return capped


@dataclass
class _Batched:
    """The jobs `estimate` leaves to one batched `evaluate_jobs` pass: their models,
    their rows (first, last, the types as their model names them, if mapped), each
    one's row key, and which jobs they are."""

    models: list[JobGoodputModel] = field(default_factory=list)
    spans: list[tuple[int, int, tuple[str, ...] | None]] = field(default_factory=list)
    row_keys: list[Hashable] = field(default_factory=list)
    jobs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def _evaluate_each(cluster: Cluster, jobs: Sequence[PolicyJob], bounds: list[int],
                   type_codes: np.ndarray, nodes: np.ndarray, replicas: np.ndarray,
                   type_maps: Sequence[Mapping[str, str] | None] | None,
                   type_names: Callable[[int, int], tuple[str, ...]],
                   out: dict[str, np.ndarray], batched: _Batched) -> None:
    """Score each job's rows (`bounds[i]:bounds[i+1]`) into `out` by its model's
    `evaluate`, one call per type, or note it in `batched` where its model has batch
    grids."""
    # Each row's (type, nodes, replicas) as bytes: a slice names a job's candidate
    # rows in one small object (`evaluate_jobs`'s row keys).
    width = 3 * 8
    row_bytes = np.stack([type_codes, nodes, replicas], axis=1).astype(np.int64).tobytes()
    batched.jobs = batched_jobs = np.zeros(len(jobs), dtype=bool)
    adaptive = Adaptivity.ADAPTIVE
    for i, job in enumerate(jobs):
        a, b = bounds[i], bounds[i + 1]
        if a == b:
            continue
        tmap = type_maps[i] if type_maps else None
        mapped = tuple(tmap.get(t, t) for t in type_names(a, b)) if tmap else None
        model = job.model
        if job.adaptivity is adaptive and hasattr(model, "grid_rows"):
            batched.models.append(cast(JobGoodputModel, model))  # (a model with batch grids)
            batched.spans.append((a, b, mapped))
            batched.row_keys.append((mapped or cluster.gpu_types,
                                     row_bytes[a * width:b * width]))
            batched_jobs[i] = True
            continue
        names = mapped or type_names(a, b)
        fixed = job.batch_size if job.adaptivity is not adaptive else None
        for t in dict.fromkeys(names):  # one call per type, in order of appearance
            ix = a + np.flatnonzero(np.array(names) == t)
            est = model.evaluate(t, nodes[ix], replicas[ix], fixed_batch_size=fixed)
            for f, arr in out.items():
                arr[ix] = getattr(est, f)


def current_index(cluster: Cluster, jobs: Sequence[PolicyJob],
                  previous: Mapping[str, JobAllocation]) -> np.ndarray:
    """Index into cluster.configs of each job's current configuration (-1: none)."""
    pos, get = cluster.config_index, previous.get
    return np.array([-1 if (cur := get(job.job_id)) is None else pos.get(cur.config, -1)
                     for job in jobs], dtype=np.int64)
